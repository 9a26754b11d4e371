"""Recent latency of one backend as the gateway measures it: exponentially weighted averages
    ewma <- ewma + alpha * (x - ewma)      (the first sample sets it)
of time to first token, time per output token, whole-request time, prefill speed (time to
first token per prompt token the backend had to prefill: this request's and those sent before
it still waiting) and output tokens per answer; and the round trip of its health probes (the
network between the gateway and it, whatever its load: health/active.py)."""

from __future__ import annotations

ALPHA = 0.2  # weight of the newest sample: about the last ten requests matter


class LatencyStats:
    __slots__ = (
        "e2e_s", "output_tokens", "prefill_s_per_token", "rtt_s", "streams", "tpot_s", "ttft_s",
    )  # fmt: skip

    def __init__(self) -> None:
        self.ttft_s: float | None = None
        self.tpot_s: float | None = None
        self.e2e_s: float | None = None
        self.prefill_s_per_token: float | None = None
        self.output_tokens: float | None = None
        self.streams = 0  # streamed answers recorded
        self.rtt_s: float | None = None  # a good health probe's round trip

    def record_stream(
        self,
        ttft_s: float,
        e2e_s: float,
        tokens: int,
        prefill_tokens: int = 0,
    ) -> None:
        """A streamed answer: its timings, output tokens, and the prompt tokens the backend had
        to prefill before its first token."""
        self.streams += 1
        self.ttft_s = _ewma(self.ttft_s, ttft_s)
        self.e2e_s = _ewma(self.e2e_s, e2e_s)
        self.output_tokens = _ewma(self.output_tokens, float(tokens))
        if prefill_tokens > 0:
            self.prefill_s_per_token = _ewma(self.prefill_s_per_token, ttft_s / prefill_tokens)
        if tokens > 1:
            self.tpot_s = _ewma(self.tpot_s, (e2e_s - ttft_s) / (tokens - 1))

    def record_probe(self, rtt_s: float) -> None:
        self.rtt_s = _ewma(self.rtt_s, rtt_s)

    def record_response(self, e2e_s: float) -> None:
        self.e2e_s = _ewma(self.e2e_s, e2e_s)


def _ewma(current: float | None, sample: float) -> float:
    return sample if current is None else current + ALPHA * (sample - current)
