"""A request's prompt as token ids, to match against the blocks engines report holding.

Engines report the token ids of the blocks they hold (kv_events/); the prefix_cache scorer
finds a prompt among them only if it turns the prompt into the same ids. fleetgate ships no model
tokenizer, so this is the project's own rule (fleetgate/tokens.py), with chat messages rendered
as fleetgate/chat_text.py renders them: exactly what the sim worker computes. A real engine's
ids come from its model's tokenizer and chat template, which this does not reproduce: route
real engines by the decision-based prefix index, `kv_events` left off (docs/scale-out.md).

Only chat requests and completions with one text prompt are tokenized; None for the others
(token-id prompts, several prompts, the Responses API), which then route as if no engine
reported anything. Costs about 0.1 ms per 1,000 prompt tokens, paid only in a pool whose
backends publish events.
"""

from __future__ import annotations

from typing import Any

import msgspec

from fleetgate.chat_text import render_chat
from fleetgate.routing.base import RoutingRequest
from fleetgate.tokens import split_tokens, token_ids

_messages = msgspec.json.Decoder(list[dict[str, Any]])


def prompt_token_ids(request: RoutingRequest) -> list[int] | None:
    """The ids the sim engine would compute for the request's prompt, or None (see above)."""
    prompt = bytes(request.prompt)
    if request.endpoint == "chat":
        try:
            text = render_chat(_messages.decode(b"[" + prompt + b"]"))
        except (msgspec.DecodeError, KeyError, TypeError, AttributeError, ValueError):
            return None  # the engine will refuse it too
    elif request.endpoint == "completions" and prompt[:1] not in (b"[", b'"'):
        # A text prompt arrives as its text; a list of prompts or ids as their raw JSON (a
        # text that itself starts with one of these is taken for one: it matches nothing).
        text = prompt.decode("utf-8", "replace")
    else:
        return None
    return token_ids(split_tokens(text))
