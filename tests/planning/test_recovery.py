"""Backoff of roles whose groups keep failing (tokenfab.planning.recovery), and the planner holding
replacements while it runs."""

from __future__ import annotations

import pytest

from tokenfab.planning import recovery
from tokenfab.planning.groups import Judging, Leaving, Placing, Wanted, plan_role
from tokenfab.planning.lifecycle import GroupView, NodeHealth, PodView
from tokenfab.planning.topology import Domain, GroupShape

NOW = 1_000.0
CRASH = "pod m-decode-0-0 failed: exit code 1, Error, boom"


@pytest.mark.parametrize(
    ("count", "wait"),
    [(1, 0.0), (2, 10.0), (3, 20.0), (4, 40.0), (5, 80.0), (6, 160.0), (7, 300.0), (30, 300.0)],
)
def test_each_failure_in_a_row_doubles_the_wait_up_to_five_minutes(count, wait):
    f = recovery.Failures(count, NOW, CRASH)
    assert f.retry_at() - NOW == wait
    assert recovery.hold(f, NOW) == wait
    assert recovery.hold(f, NOW + wait) == 0.0


@pytest.mark.parametrize(
    ("why", "counts"),
    [
        (CRASH, True),
        ("pod m-decode-0-1 succeeded", True),
        ("not bound within 90 s (1 of 2 pods unbound: 0/72 nodes are available)", True),
        ("could not be completed where it was started", True),
        ("node gb200-r01-t03 of pod m-decode-0-1 is gone", False),
        ("node gb200-r01-t03 of pod m-decode-0-1 is not ready", False),
        ("pod m-decode-0-1 is being deleted", False),
    ],
)
def test_only_failures_of_the_group_itself_count(why, counts):
    assert recovery.recurring(why) is counts
    after = recovery.update(None, [why], 0, 1, None, NOW)
    assert (after is not None) is counts


def test_failures_accumulate_and_the_last_message_is_kept():
    f = recovery.update(None, [CRASH], 0, 1, None, NOW)
    f = recovery.update(f, ["pod m-decode-1-0 failed: exit code 137, OOMKilled"], 0, 1, None, NOW + 12)
    assert f == recovery.Failures(2, NOW + 12, "pod m-decode-1-0 failed: exit code 137, OOMKilled")


def test_the_count_is_forgotten_after_two_minutes_of_health_not_before():
    f = recovery.Failures(3, NOW, CRASH)
    assert recovery.update(f, [], 1, 1, NOW + 10, NOW + 100) == f  # healthy for 90 s only
    assert recovery.update(f, [], 0, 1, None, NOW + 500) == f  # not all groups serving
    assert recovery.update(f, [], 1, 1, NOW + 10, NOW + 10 + recovery.HEALTHY_SECONDS) is None


def test_summary_says_when_the_next_attempt_comes():
    text = recovery.summary({"decode": recovery.Failures(3, NOW, CRASH)}, NOW + 5)
    assert text == f"decode: 3 group failure(s) in a row (next attempt in 15 s); last: {CRASH}"
    assert "retrying now" in recovery.summary({"decode": recovery.Failures(3, NOW, CRASH)}, NOW + 60)


def _domains() -> dict[str, Domain]:
    return {"a": Domain("a", 16, {"a-0": 4, "a-1": 4, "a-2": 4, "a-3": 4}, 4, 4)}


def test_the_planner_deletes_a_broken_group_but_holds_its_replacement_while_backing_off():
    pod = PodView("m-decode-0-0", 0, "Failed", False, "a-0", False, exit_message="exit code 1")
    group = GroupView("m-decode-0", "decode", 0, "rev", "a", 1, 4, (pod,), True, ("a-0",), NOW - 50)
    health = {n: NodeHealth(True) for n in ("a-0", "a-1", "a-2", "a-3")}
    want = Wanted("decode", 1, "rev", GroupShape(4, 4))
    held, _ = plan_role(want, [group], Placing(_domains()), Judging(health, NOW, 300.0), Leaving(10.0))
    assert [d.name for d in held.delete] == ["m-decode-0"]
    assert held.create == []
    assert held.backoff == 10.0
    assert held.unplaced == 0
    free, _ = plan_role(want, [group], Placing(_domains()), Judging(health, NOW, 300.0))
    assert [cr.reason for cr in free.create] == ["Replace"]
