"""Prompts as the engine sees them: token counts, chained block hashes, chat rendering."""

from __future__ import annotations

import random
from typing import Any

import pytest

from fleetgate.chat_text import message_text, render_chat
from fleetgate.tokens import count_tokens, filler_text
from fleetgate.workers.sim.prompt import from_text, from_token_ids, synthetic


def test_token_count_follows_the_project_rule() -> None:
    text = "Hello, world! The year 2024 was supercalifragilistic.\n\n  Indeed."
    blocks = from_text(text, block_size=4)
    assert blocks.num_tokens == count_tokens(text)
    assert len(blocks.block_hashes) == blocks.num_tokens // 4
    assert from_text("", 16).num_tokens == 1


def test_equal_prefixes_give_equal_leading_hashes() -> None:
    rng = random.Random(7)
    shared = filler_text(100, rng)  # 100 one-token words
    a = from_text(shared + filler_text(60, rng), block_size=16)
    b = from_text(shared + " zebra" + filler_text(60, rng), block_size=16)
    # Blocks 0-5 cover tokens 0-95, all inside the shared prefix; block 6 reaches past it.
    assert a.block_hashes[:6] == b.block_hashes[:6]
    assert a.block_hashes[6] != b.block_hashes[6]
    assert from_text(shared, 16).block_hashes == a.block_hashes[:6]


def test_hashes_are_chained_on_the_whole_prefix() -> None:
    # Same second block, different first block: the second hashes differ too.
    a = from_text(" the" * 4 + " of" * 4, block_size=4)
    b = from_text(" and" * 4 + " of" * 4, block_size=4)
    assert a.block_hashes[1] != b.block_hashes[1]


def test_token_id_prompts_are_prefix_stable() -> None:
    a = from_token_ids(list(range(40)), block_size=16)
    b = from_token_ids([*range(32), 99, 98], block_size=16)
    assert a.num_tokens == 40
    assert a.block_hashes[:2] == b.block_hashes[:2]


def test_synthetic_prompts_share_nothing_across_keys() -> None:
    a, b = synthetic(64, 16, "a"), synthetic(64, 16, "b")
    assert a.num_tokens == 64
    assert set(a.block_hashes).isdisjoint(b.block_hashes)
    assert synthetic(64, 16, "a") == a


def test_chat_rendering_adds_llama3_sized_overhead() -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three rivers in Europe."},
    ]
    content = sum(count_tokens(m["content"]) for m in messages)
    text = render_chat(messages)
    assert text == (
        "<|system|>\nYou are terse.\n<|user|>\nName three rivers in Europe.\n<|assistant|>\n"
    )
    # Llama-3: 5 tokens per message, plus BOS and a 4-token assistant header.
    assert count_tokens(text) == content + 5 * len(messages) + 5


def test_chat_content_parts_keep_text_only() -> None:
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": "Describe"},
        {"type": "image_url", "image_url": {"url": "data:..."}},
        {"type": "text", "text": "this picture."},
    ]
    assert message_text(parts) == "Describe\nthis picture."
    assert message_text(None) == ""
    assert render_chat([{"role": "user", "content": parts}]) == (
        "<|user|>\nDescribe\nthis picture.\n<|assistant|>\n"
    )


def test_a_conversation_is_a_prefix_of_its_next_turn() -> None:
    turn1 = [{"role": "user", "content": "Hi there."}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]
    assert render_chat(turn2).startswith(render_chat(turn1))


def test_a_continued_assistant_message_extends_the_prompt_it_answers() -> None:
    asked = [{"role": "user", "content": "hi"}]
    prefix = [*asked, {"role": "assistant", "content": " the of"}]
    assert render_chat(prefix, continue_final=True) == render_chat(asked) + " the of"
    with pytest.raises(ValueError, match="assistant"):
        render_chat(asked, continue_final=True)
