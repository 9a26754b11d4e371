"""fleetgate as it was at another commit, to measure beside this tree in the same run: the
commit's files exported from git into a cache folder and installed (core dependencies only) into
a virtual environment of their own, made once per commit and kept.

    ~/.cache/fleetgate/baseline/<sha>/tree    the commit's files (git archive)
    ~/.cache/fleetgate/baseline/<sha>/venv    its environment; bin/fleetgate runs it

The cache folder is $FLEETGATE_CACHE when set. The tree is exported, not checked out as a git
worktree, so the repository keeps no record of it and a deleted cache leaves nothing behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cache() -> Path:
    default = Path.home() / ".cache" / "fleetgate"
    return Path(os.environ.get("FLEETGATE_CACHE", default)) / "baseline"


def resolve(ref: str) -> str:
    """The full sha of `ref` in this repository (a ValueError naming it when it is none)."""
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode:
        raise ValueError(f"{ref!r} is not a commit of this repository")
    return done.stdout.strip()


def fleetgate_command(ref: str) -> tuple[list[str], str]:
    """The command that runs fleetgate at `ref` (its environment made first if it is not
    cached), and the commit's short sha."""
    sha = resolve(ref)
    home = _cache() / sha
    ready = home / ".ready"
    script = home / "venv" / "bin" / "fleetgate"
    if not ready.exists():
        print(f"making fleetgate at {sha[:9]} into {home} (once) ...", flush=True)
        tree = home / "tree"
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "archive", "--format=tar", sha], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        venv.create(home / "venv", with_pip=True, clear=True)
        pip = [str(home / "venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, str(tree)], check=True, stdout=sys.stderr)
        ready.touch()
    # The console script, not `python -m`: the current folder (this checkout) must not come
    # first on its import path.
    return [str(script)], sha[:9]
