"""Tool calls in the sim worker: the checks on `tools` and `tool_choice`, and the rule that
decides whether an answer calls a tool.

The rule, deterministic so tests can rely on it:
  - no tools, or `tool_choice` "none": no call, a text answer;
  - `tool_choice` "required": the first tool is called;
  - `tool_choice` {"type": "function", "function": {"name": N}}: N is called;
  - "auto" (the default when tools are given): the first tool whose name the last user message
    mentions (case-insensitive) is called, else the answer is text.
One call per answer (parallel calls are never made); its arguments are a JSON object made from
the function's `parameters` schema (structured.py), from the choice's seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetgate.chat_text import message_text
from fleetgate.workers.sim.structured import json_text


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """A JSON object's text."""


def parse_tools(raw: Any) -> list[Tool]:
    """The function tools of a request; ValueError saying what to change if malformed."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        raise ValueError("tools must be a non-empty array of function tools")
    tools = []
    for i, item in enumerate(raw):
        fn = item.get("function") if isinstance(item, dict) else None
        if not isinstance(fn, dict) or item.get("type") != "function":
            raise ValueError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}}')
        name, parameters = fn.get("name"), fn.get("parameters", {})
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string")
        if not isinstance(parameters, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        tools.append(Tool(name, parameters))
    return tools


def chosen_tool(
    tools: Sequence[Tool], tool_choice: Any, messages: Sequence[Mapping[str, Any]]
) -> Tool | None:
    """The tool the answer calls by the module docstring's rule, or None for a text answer;
    ValueError if `tool_choice` is malformed or names no given tool."""
    if tool_choice is None:
        tool_choice = "auto"
    if tool_choice == "required" and not tools:
        raise ValueError('tool_choice "required" needs tools')
    if tool_choice in ("none", "auto", "required"):
        if not tools or tool_choice == "none":
            return None
        if tool_choice == "required":
            return tools[0]
        said = _last_user_text(messages).lower()
        return next((t for t in tools if t.name.lower() in said), None)
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ValueError(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}'
        )
    for tool in tools:
        if tool.name == name:
            return tool
    raise ValueError(f"tool_choice names the function {name!r}, which is not in tools")


def make_call(tool: Tool, seed: int) -> ToolCall:
    """The call of `tool` a choice drawn from `seed` makes (the same seed, the same call)."""
    call_id = f"call_{random.Random(seed).getrandbits(64):016x}"
    return ToolCall(call_id, tool.name, json_text(tool.parameters or _ANY, random.Random(seed)))


_ANY = {"type": "object", "properties": {}}  # a function without parameters takes {}


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return ""
