"""Recent latency of one backend as the gateway measures it: exponentially weighted averages
    ewma <- ewma + alpha * (x - ewma)      (the first sample sets it)
of time to first token, time per output token and whole-request time."""

from __future__ import annotations

ALPHA = 0.2  # weight of the newest sample: about the last ten requests matter


class LatencyStats:
    __slots__ = ("e2e_s", "tpot_s", "ttft_s")

    def __init__(self) -> None:
        self.ttft_s: float | None = None
        self.tpot_s: float | None = None
        self.e2e_s: float | None = None

    def record_stream(self, ttft_s: float, e2e_s: float, tokens: int) -> None:
        self.ttft_s = _ewma(self.ttft_s, ttft_s)
        self.e2e_s = _ewma(self.e2e_s, e2e_s)
        if tokens > 1:
            self.tpot_s = _ewma(self.tpot_s, (e2e_s - ttft_s) / (tokens - 1))

    def record_response(self, e2e_s: float) -> None:
        self.e2e_s = _ewma(self.e2e_s, e2e_s)


def _ewma(current: float | None, sample: float) -> float:
    return sample if current is None else current + ALPHA * (sample - current)
