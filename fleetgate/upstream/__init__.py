"""Talking to one backend: one attempt of a request, its stream relayed, the prefill half of a
disaggregated request, and the deadlines an attempt keeps."""

from fleetgate.upstream.attempt import Attempts, Broken, Exchange, Failed
from fleetgate.upstream.prefill import Prefill
from fleetgate.upstream.progress import StreamProgress
from fleetgate.upstream.timeouts import Timeouts

__all__ = ["Attempts", "Broken", "Exchange", "Failed", "Prefill", "StreamProgress", "Timeouts"]
