"""The work queue (after client-go): one worker per key, bursts folded, delayed and rate-limited requeues."""

from __future__ import annotations

import threading
import time

import pytest

from tokenfab.fleet.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drain(q: WorkQueue[str]) -> list[str]:
    """Every key ready now, each marked done at once."""
    out = []
    while (key := q.get(timeout=0)) is not None:
        out.append(key)
        q.done(key)
    return out


def test_keys_come_out_in_order_and_each_once():
    q: WorkQueue[str] = WorkQueue(clock=Clock())
    for key in ["a", "b", "a", "c", "b", "a"]:
        q.add(key)
    assert len(q) == 3
    assert drain(q) == ["a", "b", "c"]
    assert q.get(timeout=0) is None


def test_a_key_added_while_processed_is_processed_once_more_after_done():
    q: WorkQueue[str] = WorkQueue(clock=Clock())
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")
    q.add("a")
    assert len(q) == 0  # never handed to a second worker while the first has it
    assert q.get(timeout=0) is None
    q.done("a")
    assert q.get(timeout=0) == "a"
    q.done("a")
    assert q.get(timeout=0) is None


def test_a_key_not_re_added_is_not_processed_again():
    q: WorkQueue[str] = WorkQueue(clock=Clock())
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.done("a")
    q.done("a")  # a second done is harmless
    assert q.get(timeout=0) is None


def test_add_after_waits_for_the_clock_and_keeps_time_order():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("late", 5.0)
    q.add_after("soon", 2.0)
    q.add_after("soon-too", 2.0)
    assert q.get(timeout=0) is None
    clock.now += 1.99
    assert q.get(timeout=0) is None
    clock.now += 0.01
    assert drain(q) == ["soon", "soon-too"]  # (ties in the order they were added)
    clock.now += 3.0
    assert drain(q) == ["late"]


def test_a_delayed_key_already_waiting_is_not_queued_twice():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add("a")
    q.add_after("a", 1.0)
    q.add_after("a", 1.0)
    clock.now += 1.0
    assert drain(q) == ["a"]
    assert drain(q) == []


def test_a_delayed_key_due_while_processed_comes_back_after_done():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add_after("a", 1.0)
    clock.now += 1.0
    assert q.get(timeout=0) is None  # due, but the key is being processed
    q.done("a")
    assert q.get(timeout=0) == "a"


@pytest.mark.parametrize("seconds", [0.0, -3.0])
def test_add_after_no_time_is_add(seconds):
    q: WorkQueue[str] = WorkQueue(clock=Clock())
    q.add_after("a", seconds)
    assert len(q) == 1


def test_rate_limited_retries_double_up_to_the_cap_and_forget_resets():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(base_delay=0.5, max_delay=3.0, clock=clock)
    assert [q.add_rate_limited("a") for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert q.failures("a") == 5
    assert q.add_rate_limited("b") == 0.5  # per key
    q.forget("a")
    assert q.failures("a") == 0
    assert q.add_rate_limited("a") == 0.5
    assert q.failures("b") == 1


def test_a_rate_limited_key_comes_back_after_its_delay():
    clock = Clock()
    q: WorkQueue[str] = WorkQueue(base_delay=2.0, clock=clock)
    q.add_rate_limited("a")
    q.add_rate_limited("a")  # 2 s, then 4 s
    clock.now += 1.9
    assert drain(q) == []
    clock.now += 0.1
    assert drain(q) == ["a"]
    clock.now += 2.0
    assert drain(q) == ["a"]


def test_shutdown_ends_every_get_and_takes_no_more_keys():
    q: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(q.get()))
    worker.start()
    time.sleep(0.05)
    q.shutdown()
    worker.join(5)
    assert got == [None]
    q.add("a")
    assert len(q) == 0
    assert q.get(timeout=0) is None


def test_a_blocked_get_wakes_for_a_new_key_and_for_a_delayed_one():
    q: WorkQueue[str] = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.extend([q.get(timeout=5), q.get(timeout=5)]))
    worker.start()
    time.sleep(0.05)
    q.add("now")
    q.add_after("later", 0.1)
    worker.join(10)
    assert got == ["now", "later"]


def test_get_times_out():
    q: WorkQueue[str] = WorkQueue()
    start = time.monotonic()
    assert q.get(timeout=0.05) is None
    assert time.monotonic() - start >= 0.04


def test_workers_never_hold_one_key_at_once_and_lose_no_trigger():
    q: WorkQueue[int] = WorkQueue()
    busy: set[int] = set()
    lock = threading.Lock()
    overlaps: list[int] = []
    passes: dict[int, int] = {}
    last_add: dict[int, float] = {}
    last_start: dict[int, float] = {}

    def worker() -> None:
        while (key := q.get(timeout=0.5)) is not None:
            with lock:
                if key in busy:
                    overlaps.append(key)
                busy.add(key)
                passes[key] = passes.get(key, 0) + 1
                last_start[key] = time.monotonic()
            time.sleep(0.001)
            with lock:
                busy.discard(key)
            q.done(key)

    workers = [threading.Thread(target=worker) for _ in range(6)]
    for w in workers:
        w.start()
    for i in range(600):
        key = i % 7
        with lock:
            last_add[key] = time.monotonic()
        q.add(key)
    for w in workers:
        w.join(20)
    assert overlaps == []
    # Every key was processed at least once after its last trigger (a trigger is never lost).
    assert set(passes) == set(range(7))
    assert all(last_start[key] >= last_add[key] for key in range(7))
    assert sum(passes.values()) < 600  # and bursts were folded
