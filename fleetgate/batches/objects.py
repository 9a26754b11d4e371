"""The Batch API's objects as OpenAI's SDK types them (openai.types.Batch, FileObject), and the
records the store keeps of each: the object and whose it is."""

from __future__ import annotations

from typing import Literal

import msgspec

Status = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
    "cancelled",
]  # fmt: skip
ACTIVE: frozenset[Status] = frozenset(("validating", "in_progress", "finalizing", "cancelling"))


class FileObject(msgspec.Struct, kw_only=True, omit_defaults=False):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class BatchError(msgspec.Struct, kw_only=True, omit_defaults=False):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class Errors(msgspec.Struct, kw_only=True, omit_defaults=False):
    object: Literal["list"] = "list"
    data: list[BatchError] = msgspec.field(default_factory=list)


class RequestCounts(msgspec.Struct, kw_only=True, omit_defaults=False):
    total: int = 0
    completed: int = 0
    failed: int = 0


class InputTokensDetails(msgspec.Struct, omit_defaults=False):
    cached_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, omit_defaults=False):
    reasoning_tokens: int = 0


class BatchUsage(msgspec.Struct, kw_only=True, omit_defaults=False):
    """What the batch's answers said they used (their `usage`), summed."""

    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = msgspec.field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class Batch(msgspec.Struct, kw_only=True, omit_defaults=False):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: Errors | None = None
    input_file_id: str
    completion_window: str
    status: Status
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = msgspec.field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    model: str | None = None
    usage: BatchUsage = msgspec.field(default_factory=BatchUsage)


class StoredFile(msgspec.Struct, kw_only=True):
    """A file and its owner (a tenant's name; "anonymous" with auth off)."""

    file: FileObject
    owner: str


class StoredBatch(msgspec.Struct, kw_only=True):
    """A batch, its owner, and what it runs as: the tenant's name and the id of the key that
    created it (never the key: the caller is rebuilt from the config at run time). Its output
    and error files' ids are drawn at creation; the batch names them once they hold lines."""

    batch: Batch
    owner: str
    key_id: str
    output_id: str
    error_id: str

    @property
    def ended_at(self) -> int | None:
        b = self.batch
        return b.failed_at or b.completed_at or b.expired_at or b.cancelled_at
