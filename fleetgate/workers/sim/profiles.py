"""Fitted performance profiles of real GPU deployments, for the simulated engine.

A profile is the whole hardware model: the step-time formula's four constants plus the KV
capacity and the vLLM scheduler limits. Every number is fitted to the published figures in
CALIBRATION.md (vidur's kernel profiles, NVIDIA NIM 1.8.0 benchmark tables, KV bytes per token);
the comment beside each number says where it came from. scripts/fit_profiles.py replays the NIM
sweep against a profile and prints the table the fit was judged on.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass

# Between a prefill engine and a decode engine, a disaggregated request's KV crosses the
# network: 200 Gb/s is one 400 Gb/s RDMA NIC (ConnectX-7, one per H100 in DGX/HGX nodes) at
# half its line rate, a conservative effective rate for NIXL's transfers.
KV_LINK_GBPS = 200.0


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """How fast one engine replica steps and how much it can hold.

    One engine iteration ("step") that schedules `tokens` new tokens (prefill chunks and one token
    per decoding sequence together) while attention reads `kv` cached tokens takes

        step = overhead_s + max(weights_time_s, tokens * compute_per_token_s)
               + kv * kv_read_per_token_s

    Small batches are bound by reading the weights once (the decode floor); large ones by
    compute. Attention is a separate, memory-bound term.
    """

    name: str
    """Registry key, `<gpus>-<model>[-<precision/parallelism>]`."""
    description: str
    """One line for humans: hardware, model, precision, what the fit is based on."""
    overhead_s: float
    """Fixed CPU cost of every step: scheduling, input preparation, sampling, launch latency."""
    weights_time_s: float
    """Time to stream the weights through the GPU once; no step with work is faster than this."""
    compute_per_token_s: float
    """Time per token scheduled in the step once the step is compute-bound (1 / prefill rate)."""
    kv_read_per_token_s: float
    """Attention cost per token of KV cache read in the step (memory-bound)."""
    num_gpu_blocks: int
    """KV-cache capacity in blocks (vLLM's `num_gpu_blocks`)."""
    block_size: int = 16
    """Tokens per KV block (vLLM's default 16)."""
    max_num_seqs: int = 1024
    """Most sequences running at once (vLLM's `max_num_seqs`; 1024 on H100, 256 on A100)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step (vLLM's `max_num_batched_tokens`; 8192 on H100, 2048 on A100)."""
    kv_bytes_per_token: int = 128 * 1024
    """KV-cache bytes of one token over all the engine's GPUs, 2 x layers x kv_heads x head_dim
    x bytes per value: what a disaggregated prefill sends a decode engine (Llama-3-8B BF16:
    128 KiB; 70B BF16: 320 KiB; 70B with FP8 KV: 160 KiB)."""

    def __post_init__(self) -> None:
        times = (
            self.overhead_s,
            self.weights_time_s,
            self.compute_per_token_s,
            self.kv_read_per_token_s,
        )
        if min(times) < 0:
            raise ValueError(f"profile {self.name!r}: step-time constants must be >= 0")
        if min(self.num_gpu_blocks, self.block_size, self.max_num_seqs) < 1:
            raise ValueError(f"profile {self.name!r}: capacities must be >= 1")
        # vLLM requires this too: every running sequence must be able to decode in every step.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"profile {self.name!r}: max_num_batched_tokens ({self.max_num_batched_tokens})"
                f" must be >= max_num_seqs ({self.max_num_seqs})"
            )

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds when full."""
        return self.num_gpu_blocks * self.block_size

    def step_time(self, tokens_in_step: int, kv_tokens_read: int) -> float:
        """Seconds one step takes; the formula is in the class docstring."""
        compute = tokens_in_step * self.compute_per_token_s
        return (
            self.overhead_s
            + (compute if compute > self.weights_time_s else self.weights_time_s)
            + kv_tokens_read * self.kv_read_per_token_s
        )


_KV_TOKENS_PER_BLOCK = 16

_H100X2_LLAMA3_70B_FP8 = EngineProfile(
    name="h100x2-llama3-70b-fp8",
    description=(
        "Llama-3.3-70B FP8 (FP8 KV cache), TP2 on 2x H100-80GB; fitted to NIM 1.8.0's"
        " 5000-in/500-out concurrency sweep and its 500-in/2000-out point"
    ),
    # NIM's TTFT at concurrency 1: 48 ms for 500 prompt tokens, 407 ms for 5000, so prefill costs
    # (407 - 48) / 4500 = 0.080 ms a token and the intercept is ~8 ms; ~6 ms of it is the step's
    # fixed cost, the rest the compute on the 500 tokens.
    overhead_s=0.0060,
    # ITL at concurrency 1 is 18.6 ms = overhead + weights + ~5.2k KV tokens of attention, so the
    # weights take ~12.5 ms: 35 GB of FP8 weights per GPU at ~2.8 TB/s (84% of 3.35 TB/s).
    weights_time_s=0.0125,
    # The TTFT slope above, nudged to 0.082 ms by the sweep (prefill chunks pay the overhead
    # three times): ~12.2k prompt tokens/s, 140 GFLOP a token at ~1.7 PFLOP/s over two GPUs.
    compute_per_token_s=0.000082,
    # ITL grows ~0.8 ms per running sequence, but the sweep shows most of that is prefill
    # interference (a 5000-token prefill arrives every ~0.6 s at 50 concurrent); what is left
    # is ~15 ns per KV token: 80 KiB of FP8 KV per token per GPU at ~5 TB/s effective.
    kv_read_per_token_s=15e-9,
    # At 100-250 concurrent, Little's law on NIM's table (920 tok/s, 500 tokens a request, ITL
    # 93 ms) gives ~86 sequences decoding, not 50: at ~5.25k tokens each that is ~450k KV
    # tokens, close to what FP8 KV allows, (0.9 * 80 GB - 35 GB weights - ~2 GB activations) /
    # 80 KiB per token per GPU ~ 430k. The sweep puts TTFT at 100-250 within 5% at 29,000.
    num_gpu_blocks=29_000,
    block_size=_KV_TOKENS_PER_BLOCK,
    # vLLM's defaults below H100 class (256 / 2048), not its H100 ones (1024 / 8192): NIM's
    # TTFT needs prefills chunked at ~2k tokens. With 8192 a whole 5000-token prefill fills one
    # step and stalls every decode for ~0.4 s; requests queued behind it then decode in lockstep
    # and finish within a few steps of each other, so arrivals bunch and TTFT at 25-50
    # concurrent comes out ~80% above NIM's (scripts/fit_profiles.py shows both).
    max_num_seqs=256,
    max_num_batched_tokens=2048,
    kv_bytes_per_token=160 * 1024,  # FP8 KV: 80 layers x 8 KV heads x 128 x 2 (K and V) x 1 B
)

_H100_LLAMA3_8B = EngineProfile(
    name="h100-llama3-8b",
    description=(
        "Llama-3.1-8B on 1x H100-80GB; step times fitted to NIM 1.8.0's ITL (4.6 / 7.6 / 16.1 ms"
        " at concurrency 1 / 100 / 250, replayed at 200 in / 200 out), capacity for BF16 KV"
    ),
    # NIM did not record this table's configuration; the fit assumes its 200-in/200-out chat
    # shape, where attention is small and ITL is overhead + weights at concurrency 1:
    # 4.6 ms = 2.0 ms fixed (CALIBRATION's 1-3 ms) + 2.6 ms weights.
    overhead_s=0.0020,
    # 4.6 ms ITL at concurrency 1 is below BF16's 4.8 ms roofline (16 GB / 3.35 TB/s), so NIM
    # served FP8 weights: 8 GB at ~3.1 TB/s ~ 2.6 ms.
    weights_time_s=0.0026,
    # ITL of 16.1 ms at 250 running makes the step compute-bound there; replaying the sweep
    # (scripts/fit_profiles.py --profile h100-llama3-8b --prompt 200 --output 200) gives
    # 26 us a token (~38k tok/s, between vidur's BF16 ~49k on H100 and the A100's ~15k).
    compute_per_token_s=0.000026,
    # 128 KiB of BF16 KV per token (the KV capacity below assumes BF16 too) at 3.35 TB/s.
    kv_read_per_token_s=39e-9,
    # ~430k KV tokens (CALIBRATION: BF16 KV at 128 KiB/token, 0.9 of 80 GB less weights).
    num_gpu_blocks=430_000 // _KV_TOKENS_PER_BLOCK,
    block_size=_KV_TOKENS_PER_BLOCK,
    max_num_seqs=1024,  # vLLM's default on H100
    max_num_batched_tokens=8192,  # vLLM's default on H100
)

_A100_LLAMA3_8B = EngineProfile(
    name="a100-llama3-8b",
    description="Llama-3-8B BF16 on 1x A100-80GB; fitted to vidur's kernel profile",
    # CALIBRATION's fixed CPU cost per step (1-3 ms), on top of vidur's GPU-only layer times.
    overhead_s=0.0020,
    # vidur's 1-token step, 9.7 ms: 16 GB of BF16 weights at ~1.65 TB/s (of 2.0 TB/s peak).
    weights_time_s=0.0097,
    # vidur: 34.6 ms at 512 tokens, 145.6 ms at 2048 -> ~70.5 us a token (~14.2k tok/s,
    # CALIBRATION's "~15k tok/s saturated prefill").
    compute_per_token_s=0.0000705,
    # 128 KiB BF16 KV per token at ~2.0 TB/s.
    kv_read_per_token_s=65e-9,
    # ~430k KV tokens on 80 GB, as for the H100 (same memory, same model).
    num_gpu_blocks=430_000 // _KV_TOKENS_PER_BLOCK,
    block_size=_KV_TOKENS_PER_BLOCK,
    max_num_seqs=256,  # vLLM's default on A100
    max_num_batched_tokens=2048,  # vLLM's default on A100
)

_H100_LLAMA3_70B_TP4 = EngineProfile(
    name="h100-llama3-70b-tp4",
    description="Llama-3-70B BF16, TP4 on 4x H100-80GB; fitted to vidur's Llama-2-70B profile",
    # CALIBRATION's fixed CPU cost per step (1-3 ms), on top of vidur's GPU-only layer times.
    overhead_s=0.0020,
    # vidur's 1-token step, 14.3 ms: 35 GB of BF16 weights per GPU at ~2.4 TB/s plus TP4's
    # all-reduces.
    weights_time_s=0.0143,
    # vidur: 30.0 ms at 512 tokens, 110.6 ms at 2048 -> ~54 us a token (~18.5k tok/s).
    compute_per_token_s=0.000054,
    # 320 KiB BF16 KV per token split over 4 GPUs = 80 KiB per GPU at ~3.35 TB/s.
    kv_read_per_token_s=24e-9,
    # ~470k KV tokens (CALIBRATION: 70B BF16 on TP4 H100).
    num_gpu_blocks=470_000 // _KV_TOKENS_PER_BLOCK,
    block_size=_KV_TOKENS_PER_BLOCK,
    max_num_seqs=1024,  # vLLM's default on H100
    max_num_batched_tokens=8192,  # vLLM's default on H100
    kv_bytes_per_token=320 * 1024,  # BF16: 80 layers x 8 KV heads x 128 x 2 (K and V) x 2 B
)

PROFILES: Mapping[str, EngineProfile] = types.MappingProxyType(
    {
        p.name: p
        for p in (
            _A100_LLAMA3_8B,
            _H100_LLAMA3_8B,
            _H100_LLAMA3_70B_TP4,
            _H100X2_LLAMA3_70B_FP8,
        )
    }
)
"""Every shipped profile by name."""


def get_profile(name: str) -> EngineProfile:
    """The shipped profile called `name`; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"unknown engine profile {name!r}; known: {known}") from None
