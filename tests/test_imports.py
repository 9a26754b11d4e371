"""The package's layering, read from its imports: no folder imports one that imports it back,
and no module imports one that imports it back, however indirectly (imports only needed by
the type checker count too: they are dependencies all the same)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fleetgate"


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _imports(path: Path, name: str) -> set[str]:
    """The fleetgate modules `path` imports (a package's own name for its __init__)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("fleetgate"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.startswith("fleetgate"):
                found.add(base)
                # `from pkg import mod` imports the module `pkg.mod` too (when it is one).
                found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = dict(_modules())
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path, name):
            while imported not in modules and "." in imported:
                imported = imported.rpartition(".")[0]  # `from pkg.mod import name`
            if imported not in (name, "fleetgate"):
                targets.add(imported)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _folder(module: str) -> str:
    """fleetgate.routing.pipeline -> routing; fleetgate.serve -> serve; workers.sim -> sim's
    parent, workers (a folder and its subfolders are one)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert _cycles(_graph()) == []


def test_no_folder_imports_one_that_imports_it_back() -> None:
    folders: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        mine = _folder(module)
        folders.setdefault(mine, set()).update(_folder(t) for t in targets if _folder(t) != mine)
    assert _cycles(folders) == []


def test_the_graph_is_read_from_real_imports() -> None:
    """The reader sees the arrows it must (so an empty cycle list means something)."""
    graph = _graph()
    assert "fleetgate.fleet.backend" in graph["fleetgate.routing.pipeline"]
    assert "fleetgate.lifecycle.events" in graph["fleetgate.resilience.failover"]
    assert "fleetgate.http.client" in graph["fleetgate.http.transport"]  # under TYPE_CHECKING
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_says_what_it_is_for_and_its_public_names_exist() -> None:
    import importlib

    for init in sorted(PACKAGE.rglob("__init__.py")):
        name = ".".join(init.relative_to(PACKAGE.parent).parent.parts)
        package = importlib.import_module(name)
        assert package.__doc__, f"{name} has no docstring"
        public = getattr(package, "__all__", None)
        if public is not None:
            assert public == sorted(public), f"{name}.__all__ is not sorted"
            missing = [n for n in public if not hasattr(package, n)]
            assert not missing, f"{name}.__all__ names what it lacks: {missing}"
