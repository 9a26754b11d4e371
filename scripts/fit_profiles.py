"""Replay NIM's concurrency sweep against an engine profile and print it beside the published table.

    .venv/bin/python scripts/fit_profiles.py                      # the shipped 70B FP8 profile
    .venv/bin/python scripts/fit_profiles.py --set max_num_batched_tokens=8192 --seeds 0,1,2
    .venv/bin/python scripts/fit_profiles.py --profile h100-llama3-8b --prompt 1000 --output 1000

The shipped profiles are constants in fleetgate/workers/sim/profiles.py; this is how their
numbers were tried. `--set` overrides profile fields; several seeds show how much the start-up
phases (where the first requests fall) move each figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from fleetgate.workers.sim.profiles import EngineProfile, get_profile
from fleetgate.workers.sim.sweep import run_concurrency_sweep

# NVIDIA NIM 1.8.0, Llama-3.3-70B FP8, TP2 on 2x H100, 5000 in / 500 out (CALIBRATION.md):
# concurrency -> (TTFT ms, ITL ms, output tok/s)
NIM_70B_5000_500 = {
    1: (407.0, 18.6, 52.0),
    5: (547.0, 21.8, 218.0),
    25: (689.0, 38.8, 623.0),
    50: (835.0, 59.7, 814.0),
    100: (7996.0, 92.9, 917.0),
    150: (34794.0, 92.9, 921.0),
    250: (88605.0, 93.2, 920.0),
}


def _override(profile: EngineProfile, settings: list[str]) -> EngineProfile:
    changes: dict[str, object] = {}
    for item in settings:
        key, _, value = item.partition("=")
        field = type(getattr(profile, key))
        changes[key] = field(value)
    return dataclasses.replace(profile, **changes)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h100x2-llama3-70b-fp8")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--concurrency", default=",".join(map(str, NIM_70B_5000_500)))
    parser.add_argument("--prompt", type=int, default=5000)
    parser.add_argument("--output", type=int, default=500)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--requests", type=int, default=None, help="measured per point")
    args = parser.parse_args()

    profile = _override(get_profile(args.profile), args.set)
    published = NIM_70B_5000_500 if (args.prompt, args.output) == (5000, 500) else {}
    started = time.perf_counter()
    print(f"{profile}\n")
    print("  conc  seed |  TTFT ms (pub)        |  ITL ms (pub)       |  tok/s (pub)      | run")
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        pub = published.get(concurrency, (float("nan"),) * 3)
        for seed in (int(s) for s in args.seeds.split(",")):
            r = run_concurrency_sweep(
                profile,
                concurrency,
                args.prompt,
                args.output,
                num_requests=args.requests,
                seed=seed,
            )
            ttft, itl = r.mean_ttft_s * 1e3, r.mean_itl_s * 1e3
            print(
                f"  {concurrency:4d}  {seed:4d}"
                f" | {ttft:7.0f} ({pub[0]:6.0f}) {ttft / pub[0] - 1:+4.0%}"
                f" | {itl:5.1f} ({pub[1]:5.1f}) {itl / pub[1] - 1:+4.0%}"
                f" | {r.output_tokens_per_s:5.0f} ({pub[2]:4.0f}) "
                f"{r.output_tokens_per_s / pub[2] - 1:+4.0%} | {r.mean_running:5.1f}"
                f" preempt {r.num_preemptions}"
            )
    if args.profile == "h100x2-llama3-70b-fp8" and published:
        r = run_concurrency_sweep(profile, 1, 500, 2000, num_requests=2)
        print(
            f"\n  500 in / 2000 out, concurrency 1: TTFT {r.mean_ttft_s * 1e3:.1f} ms (pub 48),"
            f" ITL {r.mean_itl_s * 1e3:.2f} ms (pub 18.9)"
        )
    print(f"\n{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
