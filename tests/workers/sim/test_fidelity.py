"""The fitted profiles reproduce the published figures they were fitted to (CALIBRATION.md).

The NIM sweep is replayed in virtual time (fleetgate.workers.sim.sweep); tolerances are
stated beside each check. scripts/fit_profiles.py prints the same table for exploring.
"""

from __future__ import annotations

import pytest

from fleetgate.workers.sim.profiles import PROFILES, get_profile
from fleetgate.workers.sim.sweep import SweepResult, run_concurrency_sweep

# NIM 1.8.0, Llama-3.3-70B FP8, TP2 on 2x H100: concurrency -> (TTFT s, ITL s, output tok/s)
NIM_70B = {
    1: (0.407, 0.0186, 52.0),
    5: (0.547, 0.0218, 218.0),
    25: (0.689, 0.0388, 623.0),
    50: (0.835, 0.0597, 814.0),
    100: (7.996, 0.0929, 917.0),
    150: (34.794, 0.0929, 921.0),
    250: (88.605, 0.0932, 920.0),
}
TOLERANCE = 0.25
TTFT_CHECKED = (1, 5, 25, 50)  # beyond 50 TTFT is queueing: checked for shape below
ITL_CHECKED = (1, 5, 25, 50, 100)

# vidur's non-attention step times in ms by tokens in the step (CALIBRATION.md).
VIDUR_MS = {
    "a100-llama3-8b": {1: 9.7, 512: 34.6, 2048: 145.6},
    "h100-llama3-70b-tp4": {1: 14.3, 512: 30.0, 2048: 110.6},
}


def _table(results: dict[int, SweepResult]) -> str:
    lines = ["conc     TTFT s (NIM)          ITL ms (NIM)        tok/s (NIM)      running"]
    for c, r in results.items():
        ttft, itl, tput = NIM_70B[c]
        lines.append(
            f"{c:4d}  {r.mean_ttft_s:8.3f} ({ttft:7.3f})  {r.mean_itl_s * 1e3:6.1f} "
            f"({itl * 1e3:5.1f})  {r.output_tokens_per_s:6.0f} ({tput:4.0f})  {r.mean_running:6.1f}"
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def sweep_70b() -> dict[int, SweepResult]:
    profile = get_profile("h100x2-llama3-70b-fp8")
    # Measured requests per point: enough for a stable mean, few enough for a slow CI box
    # (the whole sweep is ~15k engine steps, about a second).
    return {
        c: run_concurrency_sweep(profile, c, 5000, 500, num_requests=max(c, 8)) for c in NIM_70B
    }


def test_70b_sweep_matches_nim_within_tolerance(sweep_70b: dict[int, SweepResult]) -> None:
    misses = []
    for c, r in sweep_70b.items():
        ttft, itl, _ = NIM_70B[c]
        if c in TTFT_CHECKED and abs(r.mean_ttft_s / ttft - 1) > TOLERANCE:
            misses.append(f"TTFT at {c}: {r.mean_ttft_s:.3f} s vs {ttft} s")
        if c in ITL_CHECKED and abs(r.mean_itl_s / itl - 1) > TOLERANCE:
            misses.append(f"ITL at {c}: {r.mean_itl_s * 1e3:.1f} ms vs {itl * 1e3} ms")
    assert not misses, "\n".join(misses) + "\n" + _table(sweep_70b)


def test_70b_saturates_where_nim_does(sweep_70b: dict[int, SweepResult]) -> None:
    r = sweep_70b
    table = _table(r)
    # KV capacity runs out near 86 sequences: more load only queues. TTFT explodes...
    assert r[100].mean_ttft_s > 4 * r[50].mean_ttft_s, table
    assert r[100].mean_ttft_s < r[150].mean_ttft_s < r[250].mean_ttft_s, table
    for c in (100, 150, 250):  # ...by about what NIM saw (queueing is sensitive: 50%)
        assert abs(r[c].mean_ttft_s / NIM_70B[c][0] - 1) < 0.5, table
    # ...while ITL and throughput stay flat.
    for c in (150, 250):
        assert abs(r[c].mean_itl_s / r[100].mean_itl_s - 1) < 0.1, table
        assert abs(r[c].output_tokens_per_s / r[100].output_tokens_per_s - 1) < 0.1, table
    for c in NIM_70B:
        assert abs(r[c].output_tokens_per_s / NIM_70B[c][2] - 1) < TOLERANCE, table


def test_70b_short_prompt_long_output_point() -> None:
    # NIM: 500 in / 2000 out at concurrency 1: TTFT 48 ms, ITL 18.9 ms.
    r = run_concurrency_sweep(get_profile("h100x2-llama3-70b-fp8"), 1, 500, 2000, num_requests=1)
    assert abs(r.mean_ttft_s / 0.048 - 1) < TOLERANCE, r
    assert abs(r.mean_itl_s / 0.0189 - 1) < TOLERANCE, r


def test_8b_itl_curve() -> None:
    # NIM 1.8.0, Llama-3.1-8B: ITL 4.6 / 7.6 / 16.1 ms at 1 / 100 / 250 concurrent, output
    # saturating near 13k tok/s. The configuration was not recorded; replayed at 200 in / 200
    # out, NIM's chat shape, as the profile was fitted.
    profile = get_profile("h100-llama3-8b")
    results = {
        c: run_concurrency_sweep(profile, c, 200, 200, num_requests=max(c // 2, 4))
        for c in (1, 100, 250)
    }
    for c, itl in ((1, 0.0046), (100, 0.0076), (250, 0.0161)):
        assert abs(results[c].mean_itl_s / itl - 1) < TOLERANCE, results[c]
    assert 13_000 * (1 - TOLERANCE) < results[250].output_tokens_per_s < 13_000 * 1.25


@pytest.mark.parametrize("name", sorted(VIDUR_MS))
def test_step_times_follow_vidur(name: str) -> None:
    # The fitted floor-then-linear shape lies within 25% of vidur's kernel times at the decode
    # floor and in the compute-bound range (the knee near 128 tokens is smoother in reality).
    profile = get_profile(name)
    for tokens, ms in VIDUR_MS[name].items():
        modelled = profile.step_time(tokens, 0) - profile.overhead_s
        assert abs(modelled * 1e3 / ms - 1) < TOLERANCE, (tokens, modelled, ms)


def test_every_profile_is_registered_under_its_name() -> None:
    assert len(PROFILES) >= 4
    for name, profile in PROFILES.items():
        assert get_profile(name) is profile
    with pytest.raises(ValueError, match="known: a100-llama3-8b, h100-llama3-70b-tp4"):
        get_profile("tpu-v9")
