"""Programs the tests need from outside Python (redis-server, prometheus, chromium): found on
PATH, or installed from Debian's packages when missing (as root, or with passwordless sudo),
so that `.ci/run` passes on a fresh machine. A skip that says what to do where neither works.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def debian_program(program: str, package: str) -> str:
    """The path of `program`, installing Debian's `package` first if it is missing."""
    found = _found(program)
    if found is not None:
        return found
    if shutil.which("apt-get") is None:
        pytest.skip(f"{program} is not installed and there is no apt-get to install it")
    sudo: list[str] = []
    if os.geteuid() != 0:
        if (
            shutil.which("sudo") is None
            or subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False).returncode
        ):
            pytest.skip(f"{program} is not installed; as root: apt-get install -y {package}")
        sudo = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", package]
    if subprocess.run(install, capture_output=True, env=env, check=False).returncode:
        # A fresh machine may have no package lists yet.
        subprocess.run([*sudo, "apt-get", "update", "-qq"], capture_output=True, env=env,
                       check=False)  # fmt: skip
        done = subprocess.run(install, capture_output=True, text=True, env=env, check=False)
        if done.returncode:
            pytest.skip(f"{package} could not be installed: {done.stderr.strip()[-300:]}")
    found = _found(program)
    if found is None:
        pytest.skip(f"apt-get installed {package}, but {program} is not on PATH")
    return found


def _found(program: str) -> str | None:
    return shutil.which(program) or next(
        (str(p) for d in ("/usr/bin", "/usr/sbin") if (p := Path(d) / program).exists()), None
    )
