"""Structured output for the sim worker: JSON values made from a JSON schema, deterministic for
a seeded random source, and the checks on a request's `response_format`.

A value follows the schema's shape: `enum` and `const` pick one of theirs; an object has every
property (required or not), in the schema's order; an array `minItems` items (at least 1, at
most `maxItems`); a string one to three filler words; an integer or a number within `minimum`
and `maximum`; a `$ref` into `#/$defs` or `#/definitions` is followed; `anyOf` / `oneOf` take
their first option, `allOf` merges its parts; a type list takes its first non-null type. No
type at all makes a string; past a nesting depth of 8 an object or array comes out empty.
{"type": "json_object"} gives {"answer": <three to ten filler words>}.
"""

from __future__ import annotations

import math
import random
from typing import Any

import msgspec

from fleetgate.tokens import FILLER_WORDS

_MAX_DEPTH = 8
_MAX_ITEMS = 16  # an array's items at most, whatever minItems asks (a sim answers briefly)
_FORMATS = ("text", "json_object", "json_schema")


def check_response_format(raw: Any) -> dict[str, Any] | None:
    """The JSON schema an answer must follow ({} for any JSON object), None for plain text;
    ValueError saying what to change when `raw` is malformed."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in _FORMATS:
        raise ValueError("response_format must be an object whose type is one of " + str(_FORMATS))
    if kind == "text":
        return None
    if kind == "json_object":
        return {}
    spec = raw.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError("response_format.json_schema must be an object with a name")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise ValueError("response_format.json_schema.schema must be a JSON schema object")
    return schema


def json_text(schema: dict[str, Any], rng: random.Random) -> str:
    """A JSON text following `schema` ({} means any object; see the module docstring)."""
    if not schema:
        return msgspec.json.encode({"answer": _words(rng, 3, 10)}).decode()
    return msgspec.json.encode(json_value(schema, rng)).decode()


def json_value(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value following `schema`, as the module docstring says."""
    return _value(schema, schema, rng, 0)


def _value(schema: Any, root: dict[str, Any], rng: random.Random, depth: int) -> Any:
    if not isinstance(schema, dict):
        return _words(rng, 1, 3)
    if depth > 4 * _MAX_DEPTH:  # a $ref cycle that never reaches an object or array
        return None
    if "$ref" in schema:
        return _value(_resolve(schema["$ref"], root), root, rng, depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[rng.randrange(len(enum))]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _value(options[0], root, rng, depth + 1)
    parts = schema.get("allOf")
    if isinstance(parts, list) and parts:
        merged: dict[str, Any] = {}
        for part in parts:
            resolved = (
                _resolve(part["$ref"], root) if isinstance(part, dict) and "$ref" in part else part
            )
            if isinstance(resolved, dict):  # a $ref to nothing adds nothing
                merged |= resolved
        return _value(merged, root, rng, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return _typed(kind, schema, root, rng, depth)


def _typed(kind: Any, schema: dict[str, Any], root: dict[str, Any], rng: random.Random,
           depth: int) -> Any:  # fmt: skip
    if kind == "object":
        properties = schema.get("properties")
        if depth >= _MAX_DEPTH or not isinstance(properties, dict):
            return {}
        return {name: _value(sub, root, rng, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        size = min(max(1, _int(schema.get("minItems"), 1)), _MAX_ITEMS)
        size = min(size, _int(schema.get("maxItems"), size))
        if depth >= _MAX_DEPTH or size < 1:
            return []
        return [_value(schema.get("items"), root, rng, depth + 1) for _ in range(size)]
    if kind in ("integer", "number"):
        low = _number(schema.get("minimum"), 0.0)
        high = max(low, _number(schema.get("maximum"), low + 100.0))
        if kind == "integer":
            first = math.ceil(low)
            return rng.randint(first, max(first, math.floor(high)))
        return round(rng.uniform(low, high), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return _words(rng, 1, 3)


def _resolve(ref: Any, root: dict[str, Any]) -> Any:
    """A local `$ref` ("#/$defs/Name"); anything else resolves to no schema (a string)."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _number(value: Any, default: float) -> float:
    """A finite bound from the schema (a bound past a float's range, or not finite: none)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return default
    try:
        number = float(value)
    except OverflowError:
        return default
    return number if math.isfinite(number) else default


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choices(FILLER_WORDS, k=rng.randint(low, high)))
