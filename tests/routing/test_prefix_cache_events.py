"""The prefix_cache scorer with engines that report what they hold: a followed backend scores
by its engine's blocks, the others by the decision-based index; a prompt the gateway cannot
tokenize, or that no engine holds any of, by the index alone."""

from __future__ import annotations

import random

import msgspec

from fleetgate.chat_text import render_chat
from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.pool import Pool
from fleetgate.kv_events.index import PENDING_S, EngineBlockIndex
from fleetgate.kv_events.wire import Stored
from fleetgate.routing.base import RoutingRequest
from fleetgate.routing.prefix_cache import PrefixCacheScorer
from fleetgate.routing.prompt_tokens import prompt_token_ids
from fleetgate.routing.registry import PluginContext
from fleetgate.tokens import split_tokens, token_ids
from fleetgate.workers.sim.prompt import from_text

BS = 16
MESSAGES = [{"role": "system", "content": "be brief " * 60}, {"role": "user", "content": "hi"}]


def chat(messages: list[dict[str, str]]) -> RoutingRequest:
    """As the gateway's edge makes it: each message's JSON, joined by commas."""
    prompt = b",".join(msgspec.json.encode(m) for m in messages)
    return RoutingRequest("m", "chat", False, prompt=prompt)


def test_a_chat_prompt_becomes_the_ids_the_sim_engine_computes() -> None:
    ids = prompt_token_ids(chat(MESSAGES))
    text = render_chat(MESSAGES)
    assert ids == token_ids(split_tokens(text))
    assert ids is not None
    assert len(ids) == from_text(text, BS).num_tokens
    completion = RoutingRequest("m", "completions", False, prompt=b"once upon a time")
    assert prompt_token_ids(completion) == token_ids(split_tokens("once upon a time"))


def test_prompts_it_cannot_tokenize_give_none() -> None:
    assert prompt_token_ids(RoutingRequest("m", "completions", False, prompt=b"[1,2,3]")) is None
    assert prompt_token_ids(RoutingRequest("m", "completions", False, prompt=b'"a""b"')) is None
    assert prompt_token_ids(RoutingRequest("m", "chat", False, prompt=b"{not json")) is None
    assert prompt_token_ids(RoutingRequest("m", "chat", False, prompt=b'{"content":"x"}')) is None
    assert prompt_token_ids(RoutingRequest("m", "responses", False, prompt=b"hello")) is None


def scorer_over(n: int, engine: EngineBlockIndex) -> tuple[PrefixCacheScorer, list[BackendState]]:
    states = [BackendState(Backend(f"b{i}", f"http://127.0.0.1:{9100 + i}", ("m",)))
              for i in range(n)]  # fmt: skip
    ctx = PluginContext(random.Random(1), Pool("m", states).board)
    return PrefixCacheScorer(ctx.loads, engine_blocks=engine), states


def three_backends() -> tuple[EngineBlockIndex, PrefixCacheScorer, list[BackendState]]:
    """A scorer over b0, b1 and b2, with an engine index none of them has reported to yet."""
    engine = EngineBlockIndex(10_000)
    return engine, *scorer_over(3, engine)


def test_a_followed_backend_scores_by_its_engines_blocks_the_others_by_the_index() -> None:
    engine, scorer, states = three_backends()
    request = chat(MESSAGES)
    ids = prompt_token_ids(request)
    assert ids is not None
    held = 4 * BS  # b1's engine holds the first 4 blocks
    engine.apply("b1", [Stored(tuple(range(4)), None, tuple(ids[:held]), BS)])
    engine.apply("b0", [Stored((9,), None, tuple(range(BS)), BS)])  # b0: something else
    scorer.chosen(request, states[2], 0.0)  # b2 (no events) was sent this prompt
    shares = scorer.score(request, states, 0.0)
    assert shares[0] == 0.0  # its engine says it holds none of it, whatever was sent there
    assert shares[1] == 1.0  # the deepest holder, however little of the prompt it holds
    assert shares[2] > 0.9  # by the decision-based index: the whole prompt, less a block
    # Sent to b0: held as expected until its engine reports (or PENDING_S passes), so a
    # second request with this prefix, meanwhile, follows the first.
    scorer.chosen(request, states[0], 10.0)
    full = (len(ids) // BS) * BS
    assert scorer.score(request, states, 10.0)[:2] == [1.0, held / full]
    assert scorer.score(request, states, 10.0 + PENDING_S)[:2] == [0.0, 1.0]  # never reported


def test_what_is_left_of_an_evicted_prefix_pulls_its_prompt_back_home() -> None:
    """Under cache pressure b0's engine kept only the head of the prompt: it still scores
    as much as a whole prefix would, so the prompt goes back there (its tail computed again)
    rather than to a backend the decision-based index once spilled it to, that holds none."""
    engine, scorer, states = three_backends()
    request = chat(MESSAGES)
    ids = prompt_token_ids(request)
    assert ids is not None
    engine.apply("b0", [Stored((1, 2), None, tuple(ids[: 2 * BS]), BS)])
    engine.apply("b1", [Stored((3,), None, tuple(range(BS)), BS)])  # something else
    scorer.chosen(request, states[1], 0.0)  # a load spill, long evicted
    assert scorer.score(request, states, PENDING_S + 1.0)[:2] == [1.0, 0.0]


def test_a_follow_up_prefers_its_whole_history_to_its_system_prompt() -> None:
    """b0 holds a conversation's earlier turns, b1 only the system prompt they share: depth
    still orders the holders."""
    engine, scorer, states = three_backends()
    request = chat([*MESSAGES, {"role": "assistant", "content": "hello"},
                    {"role": "user", "content": "more " * 40}])  # fmt: skip
    ids = prompt_token_ids(request)
    assert ids is not None
    engine.apply("b0", [Stored((1, 2, 3, 4), None, tuple(ids[: 4 * BS]), BS)])
    engine.apply("b1", [Stored((5,), None, tuple(ids[:BS]), BS)])
    assert scorer.score(request, states, 0.0) == [1.0, 0.25, 0.0]


def test_a_prompt_no_engine_holds_goes_where_it_went_before() -> None:
    """Evicted everywhere: the engines' word ties every backend at 0, and the decision-based
    index keeps the prefix one home (the backend most likely to get it cached again)."""
    engine, scorer, states = three_backends()
    request = chat(MESSAGES)
    for i, state in enumerate(states):  # every engine followed, holding something else
        engine.apply(state.backend.id, [Stored((i,), None, tuple(range(i, i + BS)), BS)])
    scorer.chosen(request, states[1], 0.0)
    shares = scorer.score(request, states, PENDING_S + 1.0)  # its expectation has lapsed
    assert shares[0] == shares[2] == 0.0 and shares[1] > 0.9


def test_a_preamble_every_engine_holds_leaves_the_choice_to_the_index() -> None:
    """Each engine holds the same first block (a common system prompt): their word tells
    none apart, so the prompt goes where the rest of it was sent before."""
    engine, scorer, states = three_backends()
    request = chat(MESSAGES)
    ids = prompt_token_ids(request)
    assert ids is not None
    for i, state in enumerate(states):
        engine.apply(state.backend.id, [Stored((i,), None, tuple(ids[:BS]), BS)])
    scorer.chosen(request, states[2], 0.0)
    shares = scorer.score(request, states, PENDING_S + 1.0)
    assert shares[2] > 0.9 and shares[0] == shares[1] == 0.0


def test_a_prompt_it_cannot_tokenize_falls_back_to_the_index() -> None:
    engine = EngineBlockIndex(10_000)
    scorer, states = scorer_over(2, engine)
    engine.apply("b0", [Stored((1,), None, tuple(range(BS)), BS)])  # followed
    request = RoutingRequest("m", "completions", False, prompt=b"[" + b"1," * 400 + b"2]")
    scorer.chosen(request, states[0], 0.0)
    assert scorer.score(request, states, 0.0)[0] > 0.9  # the index's answer


def test_a_large_pools_shortlist_names_the_engines_that_hold_the_prompt_first() -> None:
    engine, scorer, states = three_backends()
    request = chat(MESSAGES)
    ids = prompt_token_ids(request)
    assert ids is not None
    engine.apply("b1", [Stored((1, 2), None, tuple(ids[: 2 * BS]), BS)])
    engine.apply("b0", [Stored((3,), None, tuple(ids[:BS]), BS)])
    scorer.chosen(request, states[2], 0.0)  # b2 by the decision-based index
    # The deepest holder by its engine's word (b1: two blocks, b0 one), then the index's.
    assert scorer.nominate(request, 0.0) == ["b1", "b2"]
    scorer.chosen(request, states[0], 0.0)  # b0 now expected to hold it all
    assert scorer.nominate(request, 0.0) == ["b1", "b0", "b2"]
