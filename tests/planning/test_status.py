"""Status of a ModelDeployment: conditions from role plans, merging them with the old ones, role counts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenfab.api.models import (
    AutoscalingStatus,
    Condition,
    GroupPlacement,
    ModelDeploymentStatus,
    RoleStatus,
)
from tokenfab.planning.groups import (
    Create,
    Delete,
    Drain,
    DrainPolicy,
    GroupView,
    Judging,
    Leaving,
    NodeHealth,
    Placing,
    PodView,
    RolePlan,
    Wanted,
    plan_role,
)
from tokenfab.planning.status import (
    Observed,
    build_status,
    conditions,
    event_for,
    merge_conditions,
    rfc3339,
    role_statuses,
)
from tokenfab.planning.topology import GpuUse, GroupShape, NodeInfo, build_domains

ENDPOINT = "http://m.ml.svc.cluster.local:8000/v1"
OBS = Observed(generation=4, frontend_available=1, frontend_desired=1, endpoint=ENDPOINT)
T0, T1 = 1_700_000_000.0, 1_700_000_600.0


def role_plan(role="decode", desired=2, ready=None, gpus=32, **fields) -> RolePlan:
    """A plan whose first `ready` groups (default: `desired`) are serving; `states` overrides them."""
    states = fields.pop("states", None)
    plan = RolePlan(role=role, desired=desired, revision="r2", shape=GroupShape(gpus, 4), **fields)
    n = desired if ready is None else ready
    plan.states = states if states is not None else {f"m-{role}-{i}": "serving" for i in range(n)}
    return plan


def summary(conds: list[Condition]) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in conds}


def message(conds: list[Condition], type_: str) -> str:
    [cond] = [c for c in conds if c.type == type_]
    return cond.message


# ------------------------------------------------------------------------------------------- conditions


def test_all_groups_ready():
    conds = conditions([role_plan("prefill", 1, gpus=8), role_plan("decode", 2)], OBS)
    assert [c.type for c in conds] == ["Ready", "Progressing", "Degraded", "Placed"]
    assert summary(conds) == {
        "Ready": ("True", "AllGroupsReady"),
        "Progressing": ("False", "Stable"),
        "Degraded": ("False", "AsExpected"),
        "Placed": ("True", "AllGroupsPlaced"),
    }
    assert message(conds, "Ready") == f"ready groups: prefill 1/1, decode 2/2; serving at {ENDPOINT}"
    assert message(conds, "Placed") == "every group is bound whole inside one NVLink domain"


def test_insufficient_capacity_names_the_gpus_needed_and_the_largest_free_block():
    plan = role_plan(ready=1, unplaced=1, largest_block=(12, "clique-b"))
    conds = conditions([plan], OBS)
    assert summary(conds)["Placed"] == ("False", "InsufficientCapacity")
    assert summary(conds)["Ready"] == ("False", "GroupsNotReady")
    assert summary(conds)["Degraded"] == ("True", "InsufficientCapacity")
    assert message(conds, "Placed") == (
        "1 a decode group needs 32 GPUs on 8 node(s) in one NVLink domain; "
        "the largest free block is 12 GPUs (domain clique-b)"
    )


def test_insufficient_capacity_with_no_free_gpu_anywhere_names_no_domain():
    conds = conditions([role_plan(ready=0, unplaced=1)], OBS)
    assert message(conds, "Placed").endswith("the largest free block is 0 GPUs")


def test_a_broken_group_degrades_and_recovers():
    plan = role_plan(
        desired=1,
        states={"m-decode-0": "broken", "m-decode-1": "serving"},
        delete=[Delete("decode", "m-decode-0", "Broken")],
        broken_reasons={"m-decode-0": "node a-3 of pod m-decode-0-3 is not ready"},
    )
    conds = conditions([plan], OBS)
    assert summary(conds)["Degraded"] == ("True", "GroupFailed")
    assert message(conds, "Degraded") == "m-decode-0: node a-3 of pod m-decode-0-3 is not ready"
    assert summary(conds)["Progressing"] == ("True", "Recovering")


def test_several_broken_groups_are_named_in_order():
    plan = role_plan(
        desired=2,
        ready=0,
        broken_reasons={"m-decode-1": "pod m-decode-1-0 failed", "m-decode-0": "pod rank 2 is missing"},
    )
    assert message(conditions([plan], OBS), "Degraded") == (
        "m-decode-0: pod rank 2 is missing; m-decode-1: pod m-decode-1-0 failed"
    )


def _replaced_broken_group() -> RolePlan:
    """plan_role's answer for a failed 8-GPU group with room for its replacement."""
    nodes = [NodeInfo(f"a-{i}", "a", 4, True, True) for i in range(4)]
    pods = (
        PodView("m-decode-0-0", 0, "Failed", False, "a-0", False),
        PodView("m-decode-0-1", 1, "Running", True, "a-1", False),
    )
    broken = GroupView("m-decode-0", "decode", 0, "r2", "a", 2, 8, pods, True)
    domains = build_domains(nodes, [GpuUse(4, p.node) for p in pods])  # its pods still hold their nodes
    health = {n.name: NodeHealth(True) for n in nodes}
    plan, _ = plan_role(
        Wanted("decode", 1, "r2", GroupShape(8, 4)), [broken], Placing(domains), Judging(health, T0, 30)
    )
    assert plan.create == [Create("decode", 1, "a", "r2", "Replace", ("a-2", "a-3"))]
    assert plan.delete == [Delete("decode", "m-decode-0", "Broken")]
    assert (plan.unbound, plan.release) == ({}, [])
    return plan


def test_replacing_a_broken_group_is_recovering_not_rolling_out():
    conds = conditions([_replaced_broken_group()], OBS)
    assert summary(conds)["Degraded"] == ("True", "GroupFailed")
    assert summary(conds)["Progressing"] == ("True", "Recovering")


@pytest.mark.parametrize(
    "plan",
    [
        role_plan(ready=2, old_groups=2, create=[Create("decode", 2, "a", "r2", "Surge")]),
        role_plan(
            ready=2,
            old_groups=2,
            states={"m-decode-0": "serving", "m-decode-1": "serving", "m-decode-2": "starting"},
        ),
        role_plan(ready=3, old_groups=2, delete=[Delete("decode", "m-decode-1", "Rollout")]),
        role_plan(ready=2, old_groups=1, delete=[Delete("decode", "m-decode-1", "Rollout")]),
    ],
    ids=["surge created", "surge starting", "old group deleted", "in-place replacement"],
)
def test_rollout_is_progressing(plan):
    conds = conditions([plan], OBS)
    assert summary(conds)["Progressing"] == ("True", "RollingOut")
    assert summary(conds)["Degraded"] == ("False", "AsExpected")


def test_a_blocked_rollout_is_not_placed():
    plan = role_plan(desired=1, old_groups=1, rollout_blocked=True, largest_block=(8, "a"))
    conds = conditions([plan], OBS)
    assert summary(conds)["Placed"] == ("False", "RolloutBlocked")
    assert message(conds, "Placed").startswith("new revision not started, old groups kept: a decode group")
    assert summary(conds)["Progressing"] == ("True", "RollingOut")


def test_missing_compute_domain_support_is_not_placed():
    plan = role_plan(ready=0, blocked="decode groups need an NVIDIA ComputeDomain")
    conds = conditions([plan], OBS)
    assert summary(conds)["Placed"] == ("False", "ComputeDomainUnavailable")
    assert message(conds, "Placed") == "decode groups need an NVIDIA ComputeDomain"


def test_new_groups_without_a_rollout_are_scaling():
    plan = role_plan(desired=3, ready=2, create=[Create("decode", 2, "a", "r2", "Missing")])
    conds = conditions([plan], OBS)
    assert summary(conds)["Progressing"] == ("True", "Scaling")
    assert message(conds, "Progressing") == "1 group(s) creating, 0 starting, 0 deleting"


def test_frontend_not_available():
    obs = Observed(generation=4, frontend_available=0, frontend_desired=2, endpoint=ENDPOINT)
    conds = conditions([role_plan()], obs)
    assert summary(conds)["Ready"] == ("False", "FrontendNotReady")
    assert message(conds, "Ready") == "frontend 0/2"


def test_groups_not_ready_is_reported_before_the_frontend():
    obs = Observed(generation=4, frontend_available=0, frontend_desired=1, endpoint=ENDPOINT)
    conds = conditions([role_plan("prefill", 1, gpus=8), role_plan(ready=1)], obs)
    assert summary(conds)["Ready"] == ("False", "GroupsNotReady")
    assert message(conds, "Ready") == "ready groups: prefill 1/1, decode 1/2"


# ----------------------------------------------------------------------------- binding and API errors


def test_groups_not_bound_yet_leave_placed_unknown_and_say_why():
    prefill = role_plan("prefill", 1, ready=0, gpus=8, unbound={"m-prefill-0": "released to the scheduler"})
    decode = role_plan(
        ready=1,
        unbound={"m-decode-1": "0/72 nodes are available", "m-decode-0": "creating ranks [1]"},
    )
    conds = conditions([prefill, decode], OBS)
    assert summary(conds)["Placed"] == ("Unknown", "Binding")
    assert message(conds, "Placed") == (
        "3 group(s) placed but not bound yet: m-prefill-0 (released to the scheduler); "
        "m-decode-0 (creating ranks [1]); m-decode-1 (0/72 nodes are available)"
    )
    # Binding is not a failure.
    assert summary(conds)["Degraded"] == ("False", "AsExpected")


def test_a_long_binding_message_is_cut():
    plan = role_plan(ready=0, unbound={f"m-decode-{i}": "x" * 100 for i in range(20)})
    text = message(conditions([plan], OBS), "Placed")
    assert text.startswith("20 group(s) placed but not bound yet: m-decode-0 (xxx")
    assert len(text) == len("20 group(s) placed but not bound yet: ") + 600


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"blocked": "decode groups need an NVIDIA ComputeDomain"}, "ComputeDomainUnavailable"),
        ({"unplaced": 1}, "InsufficientCapacity"),
        ({"rollout_blocked": True, "old_groups": 1}, "RolloutBlocked"),
    ],
)
def test_placement_failures_outrank_binding(fields, reason):
    plan = role_plan(ready=1, unbound={"m-decode-1": "released to the scheduler"}, **fields)
    assert summary(conditions([plan], OBS))["Placed"] == ("False", reason)


def test_reserved_groups_count_as_starting():
    plan = role_plan(
        desired=3, states={"m-decode-0": "serving", "m-decode-1": "reserved", "m-decode-2": "starting"}
    )
    conds = conditions([plan], OBS)
    assert summary(conds)["Progressing"] == ("True", "Scaling")
    assert message(conds, "Progressing") == "0 group(s) creating, 2 starting, 0 deleting"
    # A draining group is neither starting nor ready.
    plan = role_plan(desired=2, states={"m-decode-0": "serving", "m-decode-1": "draining"})
    conds = conditions([plan], OBS)
    assert summary(conds)["Progressing"] == ("False", "Stable")
    assert summary(conds)["Ready"] == ("False", "GroupsNotReady")


# ------------------------------------------------------------------------------------------------ drains


def test_groups_draining_alone_are_progressing_draining_and_say_since_when():
    # One starts draining this pass, one started 30 s ago; the groups wanted all serve.
    plan = role_plan(
        desired=1,
        states={"m-decode-0": "serving", "m-decode-1": "draining", "m-decode-2": "draining"},
        drain=[Drain("decode", "m-decode-2", "Surplus", 4)],
        draining={"m-decode-1": 30.4},
        drain_started={"m-decode-1": 1_800_000_000.0},
    )
    conds = conditions([plan], OBS)
    assert summary(conds) == {
        "Ready": ("True", "AllGroupsReady"),
        "Progressing": ("True", "Draining"),
        "Degraded": ("False", "AsExpected"),
        "Placed": ("True", "AllGroupsPlaced"),
    }
    assert message(conds, "Progressing") == (
        "2 group(s) out of routing, finishing their requests: "
        "m-decode-1 (since 2027-01-15T08:00:00Z), m-decode-2 (from now)"
    )
    # A second later the message is the same: a drain's time alone does not rewrite the status.
    later = replace(plan, draining={"m-decode-1": 31.4})
    assert conditions([later], OBS) == conds
    # A drain that ends this pass is still reported (its group is deleted now).
    plan = role_plan(
        desired=1,
        states={"m-decode-0": "serving", "m-decode-1": "draining"},
        delete=[Delete("decode", "m-decode-1", "Drained", 0, 12.0)],
        draining={"m-decode-1": 12.0},
    )
    assert summary(conditions([plan], OBS))["Progressing"] == ("True", "Draining")


@pytest.mark.parametrize(
    "plan",
    [
        role_plan(ready=2, old_groups=1, drain=[Drain("decode", "m-decode-1", "Rollout")]),
        role_plan(ready=2, old_groups=0, drain=[Drain("decode", "m-decode-1", "Rollout")]),
        role_plan(ready=2, old_groups=1, draining={"m-decode-1": 5.0}),
    ],
    ids=["old groups start to drain", "the last old groups start to drain", "old groups left"],
)
def test_drains_of_a_rollout_are_rolling_out(plan):
    assert summary(conditions([plan], OBS))["Progressing"] == ("True", "RollingOut")


def test_the_last_old_groups_draining_after_a_rollout_are_draining():
    plan = role_plan(ready=2, old_groups=0, draining={"m-decode-2": 5.0, "m-decode-3": 5.0})
    assert summary(conditions([plan], OBS))["Progressing"] == ("True", "Draining")


def test_draining_posts_no_event_of_its_own():
    # (The drains get their own Events from the executor: GroupDraining, GroupDrained, GroupDrainTimedOut.)
    [_, progressing, *_] = conditions([role_plan(desired=1, draining={"m-decode-1": 1.0})], OBS)
    assert progressing.reason == "Draining"
    assert event_for(progressing, None) is None


def test_draining_groups_are_counted_per_role_and_in_all():
    prefill = role_plan(
        "prefill",
        1,
        gpus=8,
        drain=[Drain("prefill", "m-prefill-1", "Surplus")],
        draining={"m-prefill-2": 3.0},
    )
    decode = role_plan(draining={"m-decode-2": 9.0})
    idle = role_plan("worker", 1, gpus=1)
    roles = role_statuses([prefill, decode, idle])
    assert {r: s.draining_groups for r, s in roles.items()} == {"prefill": 2, "decode": 1, "worker": 0}
    # (a group whose drain starts this pass and that drained before is counted once)
    twice = role_plan(drain=[Drain("decode", "m-decode-2", "Surplus")], draining={"m-decode-2": 1.0})
    assert role_statuses([twice])["decode"].draining_groups == 1
    status, _ = build_status([prefill, decode, idle], [], OBS, None, T0)
    assert status.draining_groups == 3
    assert status.model_dump(by_alias=True)["drainingGroups"] == 3
    assert status.model_dump(by_alias=True)["roles"]["prefill"]["drainingGroups"] == 2


def _serving_group(slot: int, revision: str = "r2", draining_since: float | None = None) -> GroupView:
    pods = tuple(
        PodView(f"m-decode-{slot}-{r}", r, "Running", True, f"a-{2 * slot + r}", False) for r in range(2)
    )
    return GroupView(
        f"m-decode-{slot}", "decode", slot, revision, "a", 2, 8, pods, True, draining_since=draining_since
    )


def test_status_from_a_plan_with_drains_under_way_counts_only_groups_still_draining():
    nodes = [NodeInfo(f"a-{i}", "a", 4, True, True) for i in range(8)]
    health = {n.name: NodeHealth(True) for n in nodes}
    groups = [_serving_group(0), _serving_group(1, draining_since=T0 - 30), _serving_group(2)]
    groups.append(_serving_group(3, draining_since=T0 - 10))
    domains = build_domains(nodes, [])
    drain = DrainPolicy(600, {"m-decode-1": 2, "m-decode-2": 1})

    def planned(desired: int) -> RolePlan:
        return plan_role(
            Wanted("decode", desired, "r2", GroupShape(8, 4)),
            groups,
            Placing(domains),
            Judging(health, T0, 30),
            Leaving(drain=drain),
        )[0]

    # Scaled to 1: m-decode-2 starts to drain; m-decode-1 and -3 go on.
    plan = planned(1)
    assert [d.name for d in plan.drain] == ["m-decode-2"]
    assert role_statuses([plan])["decode"].draining_groups == 3
    assert role_statuses([plan])["decode"].groups == "1/1"
    assert summary(conditions([plan], OBS))["Progressing"] == ("True", "Draining")
    # Scaled to 3: the two draining groups are taken back, and count as ready again, not as draining.
    plan = planned(3)
    assert plan.undrain == ["m-decode-1"]
    plan = planned(4)
    assert plan.undrain == ["m-decode-1", "m-decode-3"]
    statuses = role_statuses([plan])["decode"]
    assert (statuses.draining_groups, statuses.groups) == (0, "4/4")
    assert summary(conditions([plan], OBS))["Progressing"] == ("False", "Stable")


ERRORS = (
    'pods "m-decode-1-0" is forbidden: exceeded quota: gpus',
    "the server was unable to return a response",
)


def test_api_errors_while_groups_are_short_make_ready_false_with_the_servers_words():
    obs = Observed(4, 1, 1, ENDPOINT, errors=ERRORS)
    conds = conditions([role_plan(ready=1)], obs)
    assert summary(conds)["Ready"] == ("False", "ReconcileError")
    assert message(conds, "Ready") == f"ready groups: decode 1/2; the API server refused: {'; '.join(ERRORS)}"
    assert summary(conds)["Degraded"] == ("True", "ReconcileError")
    assert message(conds, "Degraded") == f"the API server refused: {'; '.join(ERRORS)}"


def test_api_errors_while_the_frontend_is_down_make_ready_false():
    obs = Observed(4, 0, 1, ENDPOINT, errors=ERRORS[:1])
    conds = conditions([role_plan()], obs)
    assert summary(conds)["Ready"] == ("False", "ReconcileError")


def test_api_errors_while_everything_serves_keep_ready_but_degrade():
    conds = conditions([role_plan()], Observed(4, 1, 1, ENDPOINT, errors=ERRORS[:1]))
    assert summary(conds)["Ready"] == ("True", "AllGroupsReady")
    assert summary(conds)["Degraded"] == ("True", "ReconcileError")


def test_api_errors_outrank_broken_groups_in_degraded_and_are_cut():
    plan = role_plan(desired=1, broken_reasons={"m-decode-0": "pod m-decode-0-0 failed"})
    conds = conditions([plan], Observed(4, 1, 1, ENDPOINT, errors=("e" * 2000,)))
    assert summary(conds)["Degraded"] == ("True", "ReconcileError")
    assert message(conds, "Degraded") == "the API server refused: " + "e" * 900
    # Without errors, the broken group is named (and a long list is cut too).
    many = {f"m-decode-{i:02d}": "pod rank 1 is missing" for i in range(50)}
    conds = conditions([role_plan(desired=1, broken_reasons=many)], OBS)
    assert summary(conds)["Degraded"] == ("True", "GroupFailed")
    assert message(conds, "Degraded").startswith("m-decode-00: pod rank 1 is missing; m-decode-01: ")
    assert len(message(conds, "Degraded")) == 900


# ------------------------------------------------------------------------------------- merge_conditions


def cond(type_, status, reason, message="", ltt=None, gen=None) -> Condition:
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=ltt,
        observed_generation=gen,
    )


OLD_TIME = rfc3339(T0)


def test_first_conditions_are_all_new():
    merged, changed = merge_conditions([], [cond("Ready", "True", "AllGroupsReady")], 7, T0)
    assert merged == [cond("Ready", "True", "AllGroupsReady", ltt="2023-11-14T22:13:20Z", gen=7)]
    assert changed == merged


def test_unchanged_status_keeps_the_transition_time_and_is_not_reported():
    old = [cond("Ready", "True", "AllGroupsReady", "ready groups: decode 2/2", OLD_TIME, 3)]
    new = [cond("Ready", "True", "AllGroupsReady", "ready groups: decode 3/3")]
    merged, changed = merge_conditions(old, new, 4, T1)
    assert merged == [cond("Ready", "True", "AllGroupsReady", "ready groups: decode 3/3", OLD_TIME, 4)]
    assert changed == []


def test_a_new_reason_with_the_same_status_is_reported_but_keeps_the_transition_time():
    old = [cond("Progressing", "True", "Scaling", "", OLD_TIME, 3)]
    merged, changed = merge_conditions(old, [cond("Progressing", "True", "RollingOut")], 4, T1)
    assert merged == [cond("Progressing", "True", "RollingOut", "", OLD_TIME, 4)]
    assert changed == merged


def test_a_new_status_updates_the_transition_time_and_is_reported():
    old = [cond("Ready", "True", "AllGroupsReady", "", OLD_TIME, 3)]
    merged, changed = merge_conditions(old, [cond("Ready", "False", "GroupsNotReady")], 4, T1)
    assert merged == [cond("Ready", "False", "GroupsNotReady", "", rfc3339(T1), 4)]
    assert changed == merged
    assert rfc3339(T1) != OLD_TIME


def test_conditions_of_other_owners_are_kept_untouched():
    metrics = cond("MetricsUnavailable", "True", "PrometheusUnreachable", "connection refused", OLD_TIME, 2)
    old = [cond("Ready", "True", "AllGroupsReady", "", OLD_TIME, 2), metrics]
    merged, changed = merge_conditions(old, [cond("Ready", "True", "AllGroupsReady")], 5, T1)
    assert merged == [cond("Ready", "True", "AllGroupsReady", "", OLD_TIME, 5), metrics]
    assert changed == []


def test_only_the_conditions_that_moved_are_reported():
    old = merge_conditions([], conditions([role_plan()], OBS), 1, T0)[0]
    short = role_plan(states={"m-decode-0": "serving", "m-decode-1": "starting"})
    merged, changed = merge_conditions(old, conditions([short], OBS), 2, T1)
    assert [(c.type, c.status, c.reason) for c in changed] == [
        ("Ready", "False", "GroupsNotReady"),
        ("Progressing", "True", "Scaling"),
    ]
    times = {c.type: c.last_transition_time for c in merged}
    assert times == {
        "Ready": rfc3339(T1),
        "Progressing": rfc3339(T1),
        "Degraded": rfc3339(T0),
        "Placed": rfc3339(T0),
    }
    assert {c.observed_generation for c in merged} == {2}


# ---------------------------------------------------------------------------------------- role statuses


def test_role_statuses_count_groups_and_gpus():
    plans = [role_plan("prefill", 2, ready=1, gpus=8), role_plan("decode", 2, gpus=32)]
    assert role_statuses(plans) == {
        "prefill": RoleStatus(
            desired_groups=2, ready_groups=1, gpus_per_group=8, desired_gpus=16, ready_gpus=8, groups="1/2"
        ),
        "decode": RoleStatus(
            desired_groups=2, ready_groups=2, gpus_per_group=32, desired_gpus=64, ready_gpus=64, groups="2/2"
        ),
    }


def test_only_serving_groups_count_as_ready():
    plan = role_plan(
        "worker",
        3,
        gpus=1,
        states={
            "w-0": "serving",
            "w-1": "starting",
            "w-2": "reserved",
            "w-3": "broken",
            "w-4": "deleting",
            "w-5": "draining",
        },
    )
    status = role_statuses([plan])["worker"]
    assert (status.groups, status.ready_gpus, status.desired_gpus) == ("1/3", 1, 3)


def test_build_status_sums_gpus_and_carries_the_autoscaler_state():
    plans = [role_plan("prefill", 2, ready=1, gpus=8), role_plan("decode", 2, gpus=32)]
    placement = [
        GroupPlacement(group="m-prefill-1", role="prefill", domain="b", gpus=8),
        GroupPlacement(group="m-decode-0", role="decode", domain="a", gpus=32),
        GroupPlacement(group="m-prefill-0", role="prefill", domain="a", gpus=8),
    ]
    scaler = AutoscalingStatus(desired={"decode": 2})
    old = ModelDeploymentStatus(autoscaling=AutoscalingStatus(desired={"decode": 1}))
    status, changed = build_status(plans, placement, OBS, old, T0, autoscaling=scaler)
    assert status.gpus == "72/80"
    assert status.observed_generation == 4
    assert status.endpoint == ENDPOINT
    assert status.autoscaling == scaler
    assert [p.group for p in status.placement] == ["m-decode-0", "m-prefill-0", "m-prefill-1"]
    assert [c.type for c in changed] == ["Ready", "Progressing", "Degraded", "Placed"]


def test_autoscaler_conditions_are_dropped_when_autoscaling_is_off():
    metrics = Condition(type="MetricsUnavailable", status="True", reason="NoData", message="x")
    old = ModelDeploymentStatus(conditions=[metrics])
    on, _ = build_status([role_plan("decode", 1)], [], OBS, old, T0, autoscaling=AutoscalingStatus())
    off, _ = build_status([role_plan("decode", 1)], [], OBS, old, T0, autoscaling=None)
    assert "MetricsUnavailable" in [c.type for c in on.conditions]
    assert "MetricsUnavailable" not in [c.type for c in off.conditions]
    assert off.autoscaling is None


def test_not_ready_says_why_a_starting_group_waits():
    plan = role_plan("decode", 2, ready=1)
    plan.states["m-decode-1"] = "starting"
    plan.waiting["m-decode-1"] = (
        'pod m-decode-1-0: 0/72 nodes are available: persistentvolumeclaim "models" not found'
    )
    conds = conditions([plan], OBS)
    assert summary(conds)["Ready"] == ("False", "GroupsNotReady")
    assert message(conds, "Ready") == (
        "ready groups: decode 1/2; waiting: pod m-decode-1-0: 0/72 nodes are available: "
        'persistentvolumeclaim "models" not found'
    )


def test_plan_role_records_why_a_pod_waits():
    nodes = [NodeInfo(f"a-{i}", "a", 4, True, True) for i in range(4)]
    domains = build_domains(nodes, [])
    pending = PodView("m-decode-0-0", 0, "Pending", False, None, False, waiting="0/4 nodes are available")
    running = PodView("m-decode-0-1", 1, "Running", True, "a-1", False)
    group = GroupView("m-decode-0", "decode", 0, "r2", "a", 2, 8, (pending, running), True)
    plan, _ = plan_role(
        Wanted("decode", 1, "r2", GroupShape(8, 4)),
        [group],
        Placing(domains),
        Judging({"a-1": NodeHealth(True)}, 0.0, 30.0),
    )
    assert plan.states == {"m-decode-0": "starting"}
    assert plan.waiting == {"m-decode-0": "pod m-decode-0-0: 0/4 nodes are available"}
    assert plan.unbound == {"m-decode-0": "0/4 nodes are available"}
    conds = conditions([plan], OBS)
    assert summary(conds)["Placed"] == ("Unknown", "Binding")
    assert (
        message(conds, "Placed")
        == "1 group(s) placed but not bound yet: m-decode-0 (0/4 nodes are available)"
    )


def test_a_group_the_api_server_refused_is_not_placed():
    """A refused create leaves no group: Placed is False with the API server's words, never True."""
    words = 'pods "m-decode-1-0" is forbidden: exceeded quota: gpu, requested: nvidia.com/gpu=4'
    plan = role_plan(ready=1, refused={"m-decode-1": words})
    conds = conditions([plan], OBS)
    assert summary(conds)["Placed"] == ("False", "CreateRefused")
    assert words in message(conds, "Placed")
