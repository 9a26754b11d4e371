"""What a Batch API request costs a gateway that shares its batch directory: the look at the
directory each one takes first (batches/scan.py), against the floor of any such look, a bare
os.scandir and a stat of each object, on the same directory in the same run (a ratio).

    .venv/bin/python benchmarks/batch_scan.py [--objects 1000,5000] [--rounds 30]

For each count: that many uploaded files (each an object and its content) and as many batch
objects, written by one store; another store, sharing the directory, looks once to read them
all, then `--rounds` times more with nothing changed (what nearly every request finds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from fleetgate.batches.objects import Batch, FileObject, StoredBatch
from fleetgate.batches.store import BatchStore


def fill(root: Path, count: int) -> None:
    store = BatchStore(root, random.Random(1))
    for _ in range(count):
        file = FileObject(id=store.new_id("file-"), bytes=2, created_at=1, filename="a.jsonl",
                          purpose="batch")  # fmt: skip
        store.add(store.write_file(file, "alice", b"x\n"))
        batch = Batch(id=store.new_id("batch_"), endpoint="/v1/chat/completions",
                      input_file_id=file.id, completion_window="24h", status="completed",
                      created_at=1)  # fmt: skip
        store.save_batch(StoredBatch(batch=batch, owner="alice", key_id="", output_id="o",
                                     error_id="e"), durable=False)  # fmt: skip


def floor(root: Path) -> None:
    for kind in ("files", "batches"):
        for entry in os.scandir(root / kind):
            if entry.name.endswith(".json"):
                entry.stat()


async def looks(store: BatchStore, rounds: int) -> list[float]:
    took = []
    for _ in range(rounds):
        start = time.perf_counter()
        await store.refresh(())
        took.append(time.perf_counter() - start)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", default="1000,5000")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    print(f"{'objects':>8} {'first look ms':>14} {'look ms (p50)':>14} {'floor ms (p50)':>15} "
          f"{'ratio':>6}")  # fmt: skip
    for count in (int(n) for n in args.objects.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder)
            fill(root, count)
            other = BatchStore(root, random.Random(2))
            start = time.perf_counter()
            asyncio.run(other.refresh(()))
            first = time.perf_counter() - start
            assert len(other.files) == count and len(other.batches) == count
            took = asyncio.run(looks(other, args.rounds))
            bare = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                floor(root)
                bare.append(time.perf_counter() - start)
            look, base = statistics.median(took), statistics.median(bare)
            print(f"{2 * count:>8} {first * 1e3:>14.1f} {look * 1e3:>14.2f} {base * 1e3:>15.2f} "
                  f"{look / base:>5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
