"""What STYLE.md asks of the package's code that a reading of its source can check."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fleetgate"


def test_no_call_passes_more_than_six_arguments_by_position() -> None:
    """Calls with more than a few arguments name them (STYLE.md): an event or a composition
    root built from 17 positional values cannot be read, and a swapped pair goes unseen. A
    variadic call (`*cells`) is not counted."""
    crowded = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and len(node.args) > 6
                and not any(isinstance(a, ast.Starred) for a in node.args)
            ):
                crowded.append(f"{path}:{node.lineno}: {ast.unparse(node.func)}")
    assert not crowded, "\n".join(crowded)
