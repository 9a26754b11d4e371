"""fleetgate as a user installs it: the wheel built from this tree, installed with no extras into
a new virtual environment, gives a working gateway (`fleetgate serve` with its built-in
simulated fleet answers the official openai SDK, whole and streamed); a command that needs an
extra says in one line what to install."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.procs import python, wait_ready

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-3.1-8b-instruct"  # one of the built-in fleet's models
HI = [{"role": "user", "content": "Hello!"}]
# What a checkout holds that is not the project: environments, caches, build leftovers.
LOCAL = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out")

# Building the wheel and installing its dependencies comes first, in whichever test runs first.
pytestmark = pytest.mark.timeout(400)


def _run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a new virtual environment holding the wheel and its core dependencies."""
    tmp = tmp_path_factory.mktemp("clean-install")
    # Built from a copy: building in place leaves build/ and *.egg-info in the checkout.
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LOCAL))
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp), str(source)], tmp
    )
    (wheel,) = tmp.glob("fleetgate-*.whl")
    venv.create(tmp / "venv", with_pip=True)
    bin_dir = tmp / "venv" / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], tmp)
    return bin_dir


@pytest.fixture(scope="module")
def gateway_url(installed: Path) -> Iterator[str]:
    with python([str(installed / "fleetgate"), "serve", "--port", "0"]) as proc:
        port = proc.wait_for(r"listening on http://127\.0\.0\.1:(\d+)")[0]
        url = f"http://127.0.0.1:{port}"
        wait_ready(url + "/readyz")
        yield url


def test_the_environment_holds_the_wheel_and_no_extra(installed: Path) -> None:
    probe = (
        "import importlib.util, fleetgate; print(fleetgate.__file__); "
        "print([m for m in ('onnxruntime', 'tokenizers', 'pynvml', 'openai') "
        "if importlib.util.find_spec(m)])"
    )
    where, extras = _run([str(installed / "python"), "-c", probe], installed).splitlines()
    assert where.startswith(str(installed.parent)), where  # not this checkout
    assert extras == "[]"


def test_the_gateway_answers_whole_and_streamed(gateway_url: str) -> None:
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8)
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens == 8
    stream = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text


def test_a_command_needing_an_extra_says_what_to_install(installed: Path) -> None:
    done = subprocess.run(
        [str(installed / "fleetgate"), "worker", "embed", "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "fleetgate worker embed: needs the embed extra (no module named 'onnxruntime'):"
        " pip install 'fleetgate[embed]'"
    ]
