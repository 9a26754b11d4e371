"""The adaptive concurrency limit: down when the engines queue or first tokens are late, up
while it is what holds requests back, still when it has nothing to go on."""

from __future__ import annotations

from collections.abc import Callable

from fleetgate.fleet.backend import Backend, BackendState
from fleetgate.fleet.engine_load import EngineLoad
from fleetgate.fleet.load_board import MemoryLoadBoard
from fleetgate.fleet.pool import Pool
from fleetgate.lifecycle.events import AttemptEnded
from fleetgate.traffic.concurrency import ConcurrencyLimit, LimitSettings


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def setup(**settings: float) -> tuple[ConcurrencyLimit, Pool, Clock]:
    clock = Clock()
    states = [BackendState(Backend(f"b{i}", f"http://127.0.0.1:{i + 1}", ("m",))) for i in range(2)]
    pool = Pool("m", states)
    params = {"initial_per_backend": 10, **settings}
    return ConcurrencyLimit(LimitSettings(**params), pool, clock), pool, clock  # type: ignore[arg-type]


def engines(pool: Pool, clock: Clock, waiting: float) -> None:
    for state in pool.states:
        state.engine = EngineLoad(10, waiting, 0.5, 0, 0, None, clock.now)


def ended(
    limit: ConcurrencyLimit, pool: Pool, ttft_s: float, prompt: int = 100, priority: int = 1
) -> None:
    """An answered first attempt to the pool's first backend, its first token `ttft_s` after
    it was sent."""
    limit.on_attempt_ended(
        AttemptEnded(
            request_id=b"r", at=0.0, model="m", backend=pool.states[0].backend.id, kind="first",
            sent_at=0.0, prompt_tokens=prompt, queued_prefill=0, status=200, error=None,
            retry_after_s=None, first_token_at=ttft_s, output_tokens=10, stream=True,
            priority=priority,
        )
    )  # fmt: skip


def tick(limit: ConcurrencyLimit, clock: Clock, reached: bool) -> int:
    clock.now += 1.0
    if reached:
        limit.reached()
    limit.tick(clock.now)
    return limit.value


def test_it_doubles_until_the_first_congestion_then_grows_slowly() -> None:
    limit, pool, clock = setup()
    assert limit.value == 20
    engines(pool, clock, waiting=0)
    assert tick(limit, clock, reached=True) == 40  # slow start
    assert tick(limit, clock, reached=False) == 40  # not reached: no reason to move
    assert tick(limit, clock, reached=True) == 80
    engines(pool, clock, waiting=10)
    assert tick(limit, clock, reached=True) == 72  # congested: x 0.9
    engines(pool, clock, waiting=0)
    assert tick(limit, clock, reached=True) == 87  # 72 * 1.2 + 1, no more doubling
    for _ in range(10):
        ended(limit, pool, ttft_s=0.7)  # over half the 1 s target: nearer congestion
    assert tick(limit, clock, reached=True) == 92  # 87.4 * 1.05 + 1


def test_it_shrinks_when_the_engines_queue_requests() -> None:
    limit, pool, clock = setup()
    engines(pool, clock, waiting=5)  # 10 queued in all, more than 2 per backend
    assert tick(limit, clock, reached=True) == 18
    engines(pool, clock, waiting=1)  # 2 queued: within what the engines may queue
    assert tick(limit, clock, reached=True) == 22  # 18 * 1.2 + 1


def test_it_shrinks_when_short_prompts_wait_long_for_their_first_token() -> None:
    limit, pool, clock = setup(target_ttft_s=1.0)
    for _ in range(10):
        ended(limit, pool, ttft_s=2.0)
    assert tick(limit, clock, reached=True) == 18
    for _ in range(10):
        ended(limit, pool, ttft_s=5.0, prompt=10_000)  # long prompts take long: not judged
    assert tick(limit, clock, reached=True) == 22


def test_stale_engine_metrics_are_not_read_and_the_floor_holds() -> None:
    limit, pool, clock = setup(stale_after_s=5.0, min_per_backend=5)
    engines(pool, clock, waiting=50)
    clock.now += 10  # the scrape is 10 s old now
    assert tick(limit, clock, reached=True) == 40  # grows: nothing says it is congested
    engines(pool, clock, waiting=50)
    for _ in range(30):
        engines(pool, clock, waiting=50)
        tick(limit, clock, reached=True)
    assert limit.value == 10  # 5 per backend


def test_a_fixed_limit_never_moves() -> None:
    limit, pool, clock = setup(max_in_flight=7)
    engines(pool, clock, waiting=50)
    assert tick(limit, clock, reached=True) == 7


def test_with_engine_priority_critical_first_tokens_do_not_hide_congestion() -> None:
    for ranked, expected in ((False, 40), (True, 18)):
        clock = Clock()
        states = [BackendState(Backend(f"b{i}", f"http://h{i}:1", ("m",))) for i in range(2)]
        pool = Pool("m", states)
        limit = ConcurrencyLimit(LimitSettings(initial_per_backend=10), pool, clock, ranked)
        for priority, ttft_s in ((0, 0.05),) * 6 + ((2, 3.0),) * 5:
            ended(limit, pool, ttft_s, priority=priority)
        # Without engine priority the median is a critical request's 50 ms: it grows; with
        # it the critical ones skip the engines' queues and the others' 3 s say congested.
        assert tick(limit, clock, reached=True) == expected


class SharedBoard(MemoryLoadBoard):
    """A board other gateways count on too (shared/load_board.py says how many)."""

    __slots__ = ("count", "told")

    def __init__(self) -> None:
        super().__init__()
        self.count = 1
        self.told: list[Callable[[int], None]] = []

    @property
    def gateways(self) -> int:
        return self.count

    def watch_gateways(self, changed: Callable[[int], None]) -> None:
        self.told.append(changed)

    def now_shared_by(self, count: int) -> None:
        self.count = count
        for changed in self.told:
            changed(count)


def test_gateways_sharing_a_pool_each_admit_their_share_of_its_limit() -> None:
    clock = Clock()
    board = SharedBoard()
    states = [BackendState(Backend(f"b{i}", f"http://127.0.0.1:{i + 1}", ("m",))) for i in range(2)]
    fixed = ConcurrencyLimit(LimitSettings(max_in_flight=10), Pool("m", states, board=board), clock)
    assert fixed.value == 10
    board.now_shared_by(3)
    assert fixed.value == 3  # 3 gateways x 3 <= 10, at once
    board.now_shared_by(40)
    assert fixed.value == 1  # never none
    board.now_shared_by(1)
    assert fixed.value == 10
    adaptive = ConcurrencyLimit(
        LimitSettings(initial_per_backend=10), Pool("m", states, board=board), clock
    )
    board.now_shared_by(2)
    assert adaptive.value == 10  # its 20, halved
    assert tick(adaptive, clock, reached=True) == 20  # it doubled to 40: this one's half


def test_the_limit_follows_backends_that_join_and_leave() -> None:
    """A pool that starts empty (its backends all to be discovered) admits one request, not
    none, and grows as backends join; one that leaves takes its share of the limit with it."""
    clock = Clock()
    pool = Pool("m", [])
    limit = ConcurrencyLimit(LimitSettings(initial_per_backend=10), pool, clock)
    assert limit.value == 1
    states = [BackendState(Backend(f"b{i}", f"http://b{i}", ("m",))) for i in range(2)]
    for state in states:
        pool.add(state, 0.0)
    assert limit.value == 20  # where a pool configured with two starts
    tick(limit, clock, reached=True)  # doubles: 40, 20 a backend
    assert limit.value == 40
    pool.retire(states[1], 1.0)  # nothing in flight: it leaves at once
    assert limit.value == 20
    fixed = ConcurrencyLimit(LimitSettings(max_in_flight=7), pool, clock)
    pool.add(states[1], 2.0)
    assert fixed.value == 7
