"""IndexedHeap against a brute-force model: after any sequence of key changes, top is a least."""

from __future__ import annotations

import random

from fleetgate.routing.heap import IndexedHeap, Key


def test_random_updates_keep_the_least_key_on_top() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        n = rng.randint(1, 40)
        keys: dict[int, Key] = {i: (float(rng.randrange(8)), rng.randrange(3)) for i in range(n)}
        heap = IndexedHeap(range(n), keys.__getitem__)
        for step in range(500):
            item = rng.randrange(n)
            old = keys[item]
            move = rng.random()
            if move < 0.4:
                keys[item] = (old[0] - rng.randrange(1, 4), old[1])
            elif move < 0.8:
                keys[item] = (old[0] + rng.randrange(1, 4), old[1])
            elif move < 0.9:
                keys[item] = (old[0], rng.randrange(3))  # ties broken the other way
            # else: update with an unchanged key
            heap.update(item)
            heap.update(n + item)  # not in the heap: ignored
            assert len(heap) == n
            assert keys[heap.top()] == min(keys.values()), (seed, step)


def test_repeatedly_retiring_the_top_yields_items_in_key_order() -> None:
    rng = random.Random(1)
    keys: dict[str, Key] = {f"i{j}": (rng.random(), j) for j in range(200)}
    expected = sorted(keys, key=keys.__getitem__)
    heap = IndexedHeap(list(keys), keys.__getitem__)
    order = []
    for _ in range(len(keys)):
        top = heap.top()
        order.append(top)
        keys[top] = (float("inf"), keys[top][1])
        heap.update(top)
    assert order == expected


def test_membership_and_size() -> None:
    keys: dict[str, Key] = {"a": (1.0, 0), "b": (0.0, 1)}
    heap = IndexedHeap(["a", "b"], keys.__getitem__)
    assert len(heap) == 2
    assert "a" in heap
    assert "c" not in heap
    assert heap.top() == "b"
