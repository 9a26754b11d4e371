"""What the prefix index costs a request with long prompts: this tree beside another commit.

    .venv/bin/python -m benchmarks.prefix_cost [--baseline eb2a32a] [--requests 4000]

The prompts are the shipped Mooncake trace's first requests (12,000 tokens on average, as the
simulator builds their bytes), routed round robin over 16 backends of an index of 64 MB with
256-byte blocks (what `prefix_cache` grows its blocks to for 16 H100s). Per request: the
prompt's block hashes, a match among the 16, the record of the choice: the `prefix_cache`
scorer's work for a request (routing/prefix_cache.py). Each tree runs the same loop in a
process of its own, in turn, `--rounds` times; the figure is each one's best round, and the
ratio is this tree's time over the baseline's. The default baseline is the last commit with
blocks of one length (the index's API since 076c8ab).
"""

from __future__ import annotations

import argparse
import pickle
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

from benchmarks.baseline import fleetgate_command
from fleetgate.simulate.workload import WorkloadSettings, prompt_bytes, requests

ROOT = Path(__file__).resolve().parents[1]
BLOCK_BYTES = 256
BACKENDS = 16

# Run by each tree's Python, outside this checkout: it imports that tree's fleetgate.
MEASURE = """
import pickle, sys, time
from fleetgate.routing.prefix_index import MemoryPrefixIndex, block_hashes, entries_for
prompts = pickle.load(open(sys.argv[1], "rb"))
backends, block = int(sys.argv[2]), int(sys.argv[3])
ids = [f"10.0.0.{i}:8000" for i in range(backends)]
index = MemoryPrefixIndex(entries_for(64.0))
for backend in ids:
    index.set_capacity(backend, 470_000 * 4 // block)
started = time.perf_counter()
for i, prompt in enumerate(prompts):
    hashes = block_hashes(prompt, block)
    index.matches(hashes, ids)
    index.record(ids[i % len(ids)], hashes)
print((time.perf_counter() - started) / len(prompts))
"""


def _prompts(count: int) -> list[bytes]:
    settings = WorkloadSettings(name="mooncake-conv", max_requests=count)
    return [prompt_bytes(r) for r in requests(settings, ["local"], random.Random(0))]


def _seconds(python: str, prompts: Path) -> float:
    done = subprocess.run(
        [python, "-c", MEASURE, str(prompts), str(BACKENDS), str(BLOCK_BYTES)],
        cwd=tempfile.gettempdir(),
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="eb2a32a", help="the commit to compare with")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    command, sha = fleetgate_command(args.baseline)
    baseline_python = str(Path(command[0]).with_name("python"))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "prompts.pickle"
        prompts = _prompts(args.requests)
        path.write_bytes(pickle.dumps(prompts))
        mean_kb = sum(map(len, prompts)) / len(prompts) / 1000
        print(f"{len(prompts)} Mooncake prompts, {mean_kb:.1f} KB on average")
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(_seconds(sys.executable, path))
            theirs.append(_seconds(baseline_python, path))
    best, reference = min(ours), min(theirs)
    print(
        msgspec.json.encode(
            {"this_tree_us": round(best * 1e6, 1), f"baseline_{sha}_us": round(reference * 1e6, 1),
             "ratio": round(best / reference, 3)}
        ).decode()
    )  # fmt: skip


if __name__ == "__main__":
    main()
