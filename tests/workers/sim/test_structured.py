"""JSON values made from schemas: valid, shaped by the schema, the same for the same seed."""

from __future__ import annotations

import json
import random

import pytest

from fleetgate.workers.sim.structured import check_response_format, json_text, json_value

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "when": {"$ref": "#/$defs/When"},
        "note": {"anyOf": [{"type": "null"}, {"type": "number"}]},
        "ok": {"type": ["boolean", "null"]},
    },
    "required": ["city", "days"],
    "$defs": {"When": {"type": "object", "properties": {"hour": {"type": "integer"}}}},
}


def test_a_value_follows_the_schemas_shape() -> None:
    value = json_value(SCHEMA, random.Random(1))
    assert list(value) == ["city", "days", "unit", "tags", "when", "note", "ok"]
    assert isinstance(value["city"], str) and value["city"]
    assert isinstance(value["days"], int) and 1 <= value["days"] <= 7
    assert value["unit"] in ("celsius", "fahrenheit")
    assert len(value["tags"]) == 2 and all(isinstance(t, str) for t in value["tags"])
    assert isinstance(value["when"]["hour"], int)
    assert value["note"] is None
    assert isinstance(value["ok"], bool)


def test_the_same_seed_gives_the_same_text_and_a_ref_cycle_ends() -> None:
    assert json_text(SCHEMA, random.Random(5)) == json_text(SCHEMA, random.Random(5))
    assert json_text(SCHEMA, random.Random(5)) != json_text(SCHEMA, random.Random(6))
    answer = json.loads(json_text({}, random.Random(5)))
    assert isinstance(answer["answer"], str)
    cycle = {"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#/$defs/A"}}}
    assert json_value(cycle, random.Random(1)) is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "json_object"}, {}),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
         {"type": "object"}),
    ],
)  # fmt: skip
def test_response_formats(raw: object, expected: object) -> None:
    assert check_response_format(raw) == expected


@pytest.mark.parametrize(
    "raw",
    ["json", {"type": "yaml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {}},
     {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}],
)  # fmt: skip
def test_malformed_response_formats_say_what_to_change(raw: object) -> None:
    with pytest.raises(ValueError, match="response_format"):
        check_response_format(raw)


def test_schemas_a_client_can_send_never_break_the_sim() -> None:
    import random

    from fleetgate.workers.sim.structured import json_value

    rng = random.Random(0)
    assert json_value({"allOf": [{"$ref": "#/nope"}, {"type": "integer"}]}, rng) is not None
    huge = json_value({"type": "integer", "minimum": 10**400}, rng)
    assert isinstance(huge, int)
    many = json_value({"type": "array", "minItems": 10**9, "items": {"type": "boolean"}}, rng)
    assert isinstance(many, list) and 1 <= len(many) <= 16
