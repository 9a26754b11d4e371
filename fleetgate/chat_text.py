"""The text a chat template makes of OpenAI-style messages, by the project's one rule.

The sim engine tokenizes this text (workers/sim/prompt.py), and so does a gateway matching
prompts against the blocks a sim engine reports holding (routing/prompt_tokens.py): both must
render a conversation the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def message_text(content: str | Iterable[Mapping[str, Any]] | None) -> str:
    """An OpenAI message's text: the string, or its text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


def render_chat(messages: Sequence[Mapping[str, Any]], continue_final: bool = False) -> str:
    """The prompt text a chat template would make of OpenAI-style `messages`.

    Each message becomes "<|{role}|>\\n{text}\\n" and the prompt ends with "<|assistant|>\\n"
    (the generation header), with `text` from `message_text`. By the project's token rule this
    adds 5 tokens per message ("<|", role, "|>", two newlines) and 5 for the closing header
    ("assistant" is two tokens), as Llama-3's template does (a 4-token header and an end-of-turn
    token per message; BOS and a 4-token assistant header). A message whose role is longer than
    8 letters ("assistant") counts one more; content that starts or ends with whitespace merges
    with the newline beside it and counts one less. A
    conversation's rendering is a text prefix of the rendering after its reply and the next
    turn are appended, so multi-turn prompts hit the prefix cache.

    With `continue_final` (vLLM's continue_final_message) the last message, the assistant's,
    is left open: no newline after its text and no generation header, so the prompt is the
    original prompt plus the text being continued. ValueError if the last message is not the
    assistant's.
    """
    parts: list[str] = []
    for message in messages:
        parts.append(f"<|{message['role']}|>\n{message_text(message.get('content'))}\n")
    if not continue_final:
        parts.append("<|assistant|>\n")
        return "".join(parts)
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("continue_final_message needs the last message to be the assistant's")
    parts[-1] = parts[-1][:-1]
    return "".join(parts)
