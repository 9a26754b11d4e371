"""An indexed binary min-heap: O(log n) update of any item's key, O(1) look at the least."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)
Key = tuple[float, int]


class IndexedHeap(Generic[T]):
    """Items ordered by `key_of(item)`; call `update(item)` whenever that key changes."""

    __slots__ = ("_heap", "_key_of", "_keys", "_pos")

    def __init__(self, items: Iterable[T], key_of: Callable[[T], Key]) -> None:
        self._key_of = key_of
        self._heap: list[T] = list(items)
        self._keys: dict[T, Key] = {item: key_of(item) for item in self._heap}
        self._heap.sort(key=self._keys.__getitem__)
        self._pos: dict[T, int] = {item: i for i, item in enumerate(self._heap)}

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, item: T) -> bool:
        return item in self._pos

    def top(self) -> T:
        return self._heap[0]

    def update(self, item: T) -> None:
        """Re-read `item`'s key and restore heap order. Unknown items are ignored."""
        i = self._pos.get(item)
        if i is None:
            return
        old = self._keys[item]
        new = self._keys[item] = self._key_of(item)
        if new < old:
            self._sift_up(i)
        else:
            self._sift_down(i)

    def _swap(self, i: int, j: int) -> None:
        heap = self._heap
        heap[i], heap[j] = heap[j], heap[i]
        self._pos[heap[i]] = i
        self._pos[heap[j]] = j

    def _sift_up(self, i: int) -> None:
        keys, heap = self._keys, self._heap
        while i > 0:
            parent = (i - 1) >> 1
            if keys[heap[i]] >= keys[heap[parent]]:
                return
            self._swap(i, parent)
            i = parent

    def _sift_down(self, i: int) -> None:
        keys, heap, n = self._keys, self._heap, len(self._heap)
        while True:
            child = 2 * i + 1
            if child >= n:
                return
            if child + 1 < n and keys[heap[child + 1]] < keys[heap[child]]:
                child += 1
            if keys[heap[child]] >= keys[heap[i]]:
                return
            self._swap(i, child)
            i = child
