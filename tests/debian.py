"""Programs the tests need from outside Python (redis-server, prometheus, chromium). They are
installed from Debian's packages by scripts/test-deps.sh, which `make test` runs before pytest;
a test that finds one missing fails with a message naming that script, never skips.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def debian_program(program: str, package: str) -> str:
    """The path of `program`; a failed test naming the install script when it is missing."""
    found = shutil.which(program) or next(
        (str(p) for d in ("/usr/bin", "/usr/sbin") if (p := Path(d) / program).exists()), None
    )
    if found is None:
        pytest.fail(
            f"{program} is not installed: run scripts/test-deps.sh (as root, or with "
            f"passwordless sudo; it installs Debian's {package}), as `make test` does",
            pytrace=False,
        )
    return found
