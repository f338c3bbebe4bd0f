"""A work queue of deployment keys, after client-go's: one worker per key at a time, bursts of triggers
folded into one pass, delayed requeues, and per-key exponential backoff after failures.

- `add(key)`: reconcile soon. A key already waiting is not queued twice; a key being processed is
  queued again once its pass ends (so an event during a pass is never lost).
- `add_after(key, seconds)`: reconcile at a later time (a timer: an autoscaler interval, a binding
  deadline, a node's toleration running out).
- `add_rate_limited(key)`: after a failed pass: retry after base x 2^failures, capped.
- `forget(key)`: a pass succeeded: the next failure starts from the base delay again.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        base_delay: float = 0.5,
        max_delay: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []
        self._seq = 0
        self._failures: dict[K, int] = {}
        self._base = base_delay
        self._max = max_delay
        self._clock = clock
        self._shutdown = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def add(self, key: K) -> None:
        with self._cond:
            if self._shutdown or key in self._dirty:
                return
            self._dirty.add(key)
            if key not in self._processing:
                self._queue.append(key)
                self._cond.notify()

    def add_after(self, key: K, seconds: float) -> None:
        if seconds <= 0:
            self.add(key)
            return
        with self._cond:
            self._seq += 1
            heapq.heappush(self._delayed, (self._clock() + seconds, self._seq, key))
            self._cond.notify()

    def add_rate_limited(self, key: K) -> float:
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay = float(min(self._max, self._base * (2**n)))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def _promote(self) -> float | None:
        """Move due delayed keys into the queue; returns seconds until the next one (None: none)."""
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            if key not in self._dirty:
                self._dirty.add(key)
                if key not in self._processing:
                    self._queue.append(key)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to process (mark it done with `done`), or None on timeout or shutdown."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                wait = self._promote()
                if self._queue:
                    key = self._queue.popleft()
                    self._processing.add(key)
                    self._dirty.discard(key)
                    return key
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
