"""A batch's input file checked line by line at creation, as OpenAI checks it: each line a JSON
object with a unique `custom_id`, `method` POST, `url` the batch's endpoint, and a `body` that
is an object naming its `model`. What is wrong is listed by line (at most `MAX_ERRORS`); a file
with any error makes a failed batch, none of it run.

A body asking to stream is run without streaming (`stream: false`, its `stream_options`
dropped): a batch's answers are whole JSON bodies."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from fleetgate.batches.objects import BatchError
from fleetgate.openai_api import with_fields
from fleetgate.traffic.door import Refused

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
MAX_ERRORS = 100  # listed in the batch's `errors` at most
MAX_CUSTOM_ID = 512  # characters of a custom_id at most
MAX_METADATA = 16  # a batch's metadata pairs at most, as OpenAI's
MAX_METADATA_KEY = 64  # characters
MAX_METADATA_VALUE = 512


@dataclass(frozen=True, slots=True)
class BatchRequest:
    line: int  # 1-based, in the input file
    custom_id: str
    body: bytes
    model: str


@dataclass(slots=True)
class Checked:
    requests: list[BatchRequest] = field(default_factory=list)
    errors: list[BatchError] = field(default_factory=list)

    @property
    def model(self) -> str | None:
        """The model every request names, if they all name the same one."""
        models = {r.model for r in self.requests}
        return models.pop() if len(models) == 1 else None


class _Line(msgspec.Struct):
    custom_id: str
    method: str
    url: str
    body: msgspec.Raw


class _Body(msgspec.Struct):
    model: str
    stream: bool | None = None


_line = msgspec.json.Decoder(_Line)
_body = msgspec.json.Decoder(_Body)


def check_input(data: bytes, endpoint: str, max_requests: int) -> Checked:
    """The requests of an input file for a batch on `endpoint`, or the errors in it."""
    checked = Checked()
    errors = checked.errors
    try:
        data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        errors.append(_error("invalid_json_line", f"Line {line} is not valid UTF-8.", line))
        return checked
    seen: set[str] = set()
    count = 0
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        count += 1
        if count > max_requests:
            errors.append(
                _error(
                    "too_many_requests",
                    f"The file has more than {max_requests} requests, the most a batch takes "
                    "here (`batches.max_requests`); split it into several batches.",
                )
            )  # fmt: skip
            break
        problem = _check_line(raw, number, endpoint, seen, checked)
        if problem is not None and len(errors) < MAX_ERRORS:
            errors.append(problem)
    if not count and not errors:
        errors.append(_error("empty_file", "The input file holds no requests."))
    return checked


def _check_line(
    raw: bytes, number: int, endpoint: str, seen: set[str], checked: Checked
) -> BatchError | None:
    try:
        line = _line.decode(raw)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).partition(" - at `$.")
        param = where.rstrip("`").split(".", 1)[0].split("[", 1)[0] or None
        if message.startswith("Object missing required field"):
            param = message.split("`")[1]
            return _error(
                "missing_required_parameter", f"Line {number} has no `{param}`.", number, param
            )
        return _error("invalid_request", f"Line {number}: {message}.", number, param)
    except msgspec.DecodeError:
        return _error("invalid_json_line", f"Line {number} is not a JSON object.", number)
    if not 0 < len(line.custom_id) <= MAX_CUSTOM_ID:
        message = f"Line {number}: `custom_id` must be 1 to {MAX_CUSTOM_ID} characters."
        return _error("invalid_custom_id", message, number, "custom_id")
    if line.custom_id in seen:
        message = f"Line {number}: the custom_id {line.custom_id[:80]!r} is used twice."
        return _error("duplicate_custom_id", message, number, "custom_id")
    seen.add(line.custom_id)
    if line.method != "POST":
        message = f"Line {number}: `method` must be POST, not {line.method[:20]!r}."
        return _error("invalid_method", message, number, "method")
    if line.url != endpoint:
        message = (
            f"Line {number}: `url` {line.url[:100]!r} is not the batch's endpoint {endpoint}; "
            "every request of a batch goes to its endpoint."
        )
        return _error("invalid_url", message, number, "url")
    body = bytes(line.body)
    try:
        parsed = _body.decode(body)
    except msgspec.DecodeError:
        message = f"Line {number}: `body` must be a JSON object with a string `model`."
        return _error("invalid_body", message, number, "body")
    if parsed.stream:
        body = with_fields(body, drop=("stream_options",), stream=False)
    checked.requests.append(BatchRequest(number, line.custom_id, body, parsed.model))
    return None


def _error(
    code: str, message: str, line: int | None = None, param: str | None = None
) -> BatchError:
    return BatchError(code=code, message=message, line=line, param=param)


def check_metadata(metadata: dict[str, str] | None) -> None:
    """`Refused` (400) for metadata over OpenAI's bounds."""
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA:
        message = f"`metadata` holds at most {MAX_METADATA} pairs, not {len(metadata)}."
        raise Refused(400, message, "invalid_value", param="metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise Refused(
                400, f"`metadata`: keys are at most {MAX_METADATA_KEY} characters, values at "
                f"most {MAX_METADATA_VALUE}.", "invalid_value", param="metadata",
            )  # fmt: skip
