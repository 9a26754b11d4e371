"""Which tool an answer calls, and the call it makes."""

from __future__ import annotations

import json

import pytest

from fleetgate.workers.sim.tools import Tool, chosen_tool, make_call, parse_tools

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
TIME = {"type": "function", "function": {"name": "get_time"}}
TOOLS = parse_tools([WEATHER, TIME])


def said(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "earlier get_time"}, {"role": "assistant", "content": ""},
            {"role": "user", "content": text}]  # fmt: skip


def test_the_rule_in_the_docstring() -> None:
    assert chosen_tool(TOOLS, None, said("what is get_time?")) == TOOLS[1]
    assert chosen_tool(TOOLS, "auto", said("hello")) is None  # only the last user message counts
    assert chosen_tool(TOOLS, "auto", said("GET_WEATHER and get_time")) == TOOLS[0]
    assert chosen_tool(TOOLS, "none", said("get_weather")) is None
    assert chosen_tool(TOOLS, "required", said("hello")) == TOOLS[0]
    named = {"type": "function", "function": {"name": "get_time"}}
    assert chosen_tool(TOOLS, named, said("hello")) == TOOLS[1]
    assert chosen_tool([], "auto", said("get_weather")) is None


def test_a_call_has_json_arguments_from_the_schema_the_same_for_the_same_seed() -> None:
    call = make_call(TOOLS[0], 11)
    assert call == make_call(TOOLS[0], 11)
    assert call.name == "get_weather" and call.id.startswith("call_")
    assert isinstance(json.loads(call.arguments)["city"], str)
    assert json.loads(make_call(TOOLS[1], 11).arguments) == {}


@pytest.mark.parametrize(
    "raw", [{}, [], ["x"], [{"type": "function"}], [{"type": "code", "function": {"name": "f"}}],
            [{"type": "function", "function": {"name": ""}}],
            [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]],
)  # fmt: skip
def test_malformed_tools_say_what_to_change(raw: object) -> None:
    with pytest.raises(ValueError, match="tools"):
        parse_tools(raw)


@pytest.mark.parametrize("choice", ["sometimes", {"function": {}}, {"function": {"name": "x"}}])
def test_a_bad_tool_choice_says_what_to_change(choice: object) -> None:
    with pytest.raises(ValueError, match="tool_choice"):
        chosen_tool([Tool("f", {})], choice, said("f"))
    with pytest.raises(ValueError, match="tool_choice"):
        chosen_tool([], "required", said("f"))
