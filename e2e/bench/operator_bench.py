"""Benchmarks of the reconciler on the local AI factory, each against a baseline measured in the same run.

1. Apply -> Ready: the DeepSeek-R1 example (2 prefill + 2 decode groups, 20 pods, 80 GPUs) versus a
   plain Deployment of the same 20 GPU pods (the control-plane floor: scheduler + kwok, no operator) and
   versus the same PodGroups and worker pods written directly (the floor of whole-gang binding: the
   scheduler binds no pod of a group before it has seen all of them). Each is timed from its create
   call to the watch event that says it is done.
2. Placement of a mixed sequence of multi-node groups: tokenfab's best fit (the planner the operator
   runs) versus the kube-scheduler alone (the same groups as plain pods with no domain affinity, placed
   by the real scheduler): how many groups end up split across NVLink domains or partly bound.

   Also, against kube-scheduler with podAffinity on the clique label (the native way to keep a group in
   one domain), tokenfab's first fit, and the exact optimum of the same groups (e2e/packing.py).

`python -m e2e.bench.operator_bench` runs both on a factory of its own and saves
e2e/bench/results/operator.json; `--compare-ref <commit>` measures (1) with this checkout's operator and
with an earlier commit's, alternated on one factory (results/operator_compare.json). The test suite's
smoke run saves nothing. Nothing passes or fails on a time alone.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch

from e2e import packing, record
from e2e.bench.scale_bench import baseline_checkout
from e2e.helpers import (
    apply_yaml,
    condition,
    get_json,
    gpu_deployment,
    install_crds,
    kubectl,
    operator_up,
    wait_for,
)
from testing.cases import EXAMPLES
from tokenfab.fleet.view import node_facts
from tokenfab.planning import contract
from tokenfab.planning.capacity import Constraints, snapshot
from tokenfab.planning.topology import GroupShape, first_fit
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import CLIQUE_LABEL, GPU_RESOURCE

ROOT = record.ROOT
NS = "bench"


def _wait_gone(f: Factory, selector: str) -> None:
    wait_for(
        "bench pods gone", lambda: not get_json(f, "pods", "-n", NS, "-l", selector)["items"], timeout=180
    )


def _ready(obj: dict[str, Any]) -> bool:
    cond = condition(obj, "Ready")
    return bool(cond and cond["status"] == "True")


def _watch_until(
    list_fn: Any, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 180, **kw: Any
) -> None:
    """Follow a watch (it begins with what exists) until `done` holds of the objects seen: the moment is
    when the API server's event arrives, not the next tick of a poll."""
    objs: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        w = watch.Watch()
        for ev in w.stream(list_fn, timeout_seconds=max(1, int(deadline - time.monotonic())), **kw):
            obj = ev["raw_object"]
            name = obj["metadata"]["name"]
            if ev["type"] == "DELETED":
                objs.pop(name, None)
            else:
                objs[name] = obj
            if done(list(objs.values())):
                w.stop()
                return
    raise AssertionError(f"timed out after {timeout:.0f} s")


def _all_ready(n: int) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda pods: len(pods) == n and all(_ready(p) for p in pods)


def gang_copy(pods: list[dict[str, Any]], groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The PodGroups and worker pods tokenfab wrote, as bare objects of the bench (no owner, no node, a
    label of their own): written directly, they give the floor of all-or-nothing binding."""
    out = []
    for o in [*groups, *pods]:
        meta = o["metadata"]
        spec = {
            k: v
            for k, v in o["spec"].items()
            if k not in ("nodeName", "serviceAccountName", "serviceAccount")
        }
        if o.get("kind", "Pod") == "Pod":  # (the deployment's discovery identity went with it)
            spec["automountServiceAccountToken"] = False
        out.append(
            {
                "apiVersion": o.get("apiVersion", "v1"),
                "kind": o.get("kind", "Pod"),
                "metadata": {"name": f"floor-{meta['name']}", "namespace": NS, "labels": {"bench-gang": "1"}},
                "spec": spec,
            }
        )
    for o in out:  # the pods name the copies of their PodGroups
        group = o["spec"].get("schedulingGroup")
        if group:
            o["spec"]["schedulingGroup"] = {**group, "podGroupName": f"floor-{group['podGroupName']}"}
    return out


def apply_to_ready(f: Factory, trials: int = 3) -> dict[str, Any]:
    """Three contestants, alternated, each timed from its create call to the API server's event saying it
    is done: tokenfab (the DeepSeek-R1 ModelDeployment Ready), a plain Deployment of the same 20 GPU pods
    (no gang, no operator: the control-plane floor), and the same PodGroups and worker pods tokenfab
    wrote, created directly by 16 threads (the floor of whole-gang binding, no operator). tokenfab's
    worker groups are read once it is Ready: each must sit whole in one NVLink domain."""
    kubectl(f, "create", "namespace", NS, check=False)
    api = f.api()
    core, apps, custom = client.CoreV1Api(api), client.AppsV1Api(api), client.CustomObjectsApi(api)
    doc = yaml.safe_load((EXAMPLES / "deepseek-r1-disaggregated.yaml").read_text())
    doc["metadata"] = {"name": "bench-ds", "namespace": NS}
    # What is measured is placement and all-or-nothing binding against its floor, which binds the same pods
    # with none of the IMEX channels or model cache claims a real cluster's drivers would serve.
    doc["spec"]["topology"]["computeDomain"] = False
    doc["spec"]["model"].pop("cache", None)
    plain = gpu_deployment("bench-plain", NS, replicas=20, gpus=4)
    md = ("tokenfab.dev", "v1alpha1", NS, "modeldeployments")
    tokenfab_s: list[float] = []
    groups_seen: list[int] = []  # worker groups of each trial
    split: list[int] = []  # of them, split across domains or not bound (unseen once Ready, in theory)
    cliques = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(CLIQUE_LABEL)
        for n in get_json(f, "nodes")["items"]
    }
    plain_s: list[float] = []
    gang_s: list[float] = []
    gang: list[dict[str, Any]] = []
    writer = ThreadPoolExecutor(16)

    def create(o: dict[str, Any]) -> None:
        if o["kind"] == "Pod":
            core.create_namespaced_pod(NS, o)
        else:
            group, version = o["apiVersion"].split("/")
            custom.create_namespaced_custom_object(group, version, NS, "podgroups", o)

    try:
        for _ in range(trials):
            t0 = time.monotonic()
            custom.create_namespaced_custom_object(*md, doc)
            _watch_until(
                custom.list_namespaced_custom_object,
                lambda objs: any(_ready(o) for o in objs),
                group="tokenfab.dev",
                version="v1alpha1",
                namespace=NS,
                plural="modeldeployments",
                field_selector="metadata.name=bench-ds",
            )
            tokenfab_s.append(round(time.monotonic() - t0, 2))
            workers = get_json(
                f, "pods", "-n", NS, "-l", f"{contract.LABEL_DEPLOYMENT}=bench-ds,{contract.COMPONENT}=worker"
            )
            spans: dict[str, set[str | None]] = {}
            for p in workers["items"]:
                spans.setdefault(p["metadata"]["labels"][contract.LABEL_GROUP], set()).add(
                    cliques.get(p["spec"].get("nodeName") or "")
                )
            groups_seen.append(len(spans))
            split.append(sum(1 for s in spans.values() if len(s) != 1 or None in s))
            if not gang and any(p["spec"].get("schedulingGroup") for p in workers["items"]):
                groups = get_json(f, "podgroups.scheduling.k8s.io", "-n", NS)["items"]
                gang = gang_copy(workers["items"], groups)
            custom.delete_namespaced_custom_object(*md, "bench-ds")
            _wait_gone(f, f"{contract.LABEL_DEPLOYMENT}=bench-ds")

            t0 = time.monotonic()
            apps.create_namespaced_deployment(NS, plain)
            _watch_until(
                core.list_namespaced_pod, _all_ready(20), namespace=NS, label_selector="app=bench-plain"
            )
            plain_s.append(round(time.monotonic() - t0, 2))
            kubectl(f, "delete", "deployment", "bench-plain", "-n", NS, "--wait=true")
            _wait_gone(f, "app=bench-plain")

            if gang:
                pods = sum(1 for o in gang if o["kind"] == "Pod")
                t0 = time.monotonic()
                list(writer.map(create, gang))
                _watch_until(
                    core.list_namespaced_pod, _all_ready(pods), namespace=NS, label_selector="bench-gang=1"
                )
                gang_s.append(round(time.monotonic() - t0, 2))
                kubectl(
                    f,
                    "delete",
                    "pods,podgroups.scheduling.k8s.io",
                    "-n",
                    NS,
                    "-l",
                    "bench-gang=1",
                    "--wait=true",
                )
                _wait_gone(f, "bench-gang=1")
    finally:
        writer.shutdown()
        api.close()
    return {
        "pods": 20,
        "gpus": 80,
        "tokenfab_groups": groups_seen,
        "tokenfab_split_groups": sum(split),
        **against_floor(tokenfab_s, plain_s, gang_s),
    }


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def against_floor(tokenfab_s: list[float], plain_s: list[float], gang_s: list[float]) -> dict[str, Any]:
    """Trials of tokenfab and of the floors (the gang floor when measured), their medians and ratios."""
    med = _median(tokenfab_s), _median(plain_s)
    out = {
        "tokenfab_seconds": tokenfab_s,
        "plain_deployment_seconds": plain_s,
        "median_tokenfab": med[0],
        "median_plain": med[1],
        "overhead_vs_floor": round(med[0] / med[1], 2) if med[1] else None,
    }
    if gang_s:
        gang = _median(gang_s)
        out |= {
            "gang_floor_seconds": gang_s,
            "median_gang_floor": gang,
            "overhead_vs_gang_floor": round(med[0] / gang, 2) if gang else None,
        }
    return out


def mixed_sequence(seed: int, budget: int) -> list[int]:
    rng = random.Random(seed)
    sizes, total = [], 0
    while True:
        g = rng.choice([4, 8, 16, 32])
        if total + g > budget:
            return sizes
        sizes.append(g)
        total += g


def _bench_pods(sizes: list[int], affinity: bool) -> list[dict[str, Any]]:
    """The groups as plain pods of 4 GPUs (a group of fewer GPUs: one pod of that many), labelled with
    their group; with `affinity`, every pod of a group requires the others' NVLink domain
    (podAffinity on the clique label), the native way to keep a group in one domain."""
    pods = []
    for i, gpus in enumerate(sizes):
        spec: dict[str, Any] = {
            "containers": [
                {"name": "w", "image": "worker", "resources": {"limits": {GPU_RESOURCE: str(min(gpus, 4))}}}
            ]
        }
        if affinity:
            spec["affinity"] = {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {"bench-group": str(i)}},
                            "topologyKey": CLIQUE_LABEL,
                        }
                    ]
                }
            }
        for rank in range(max(1, gpus // 4)):
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"g{i}-{rank}", "namespace": NS, "labels": {"bench-group": str(i)}},
                    "spec": spec,
                }
            )
    return pods


def kube_scheduler(f: Factory, sizes: list[int], affinity: bool) -> dict[str, Any]:
    """The same groups as plain pods placed by the real scheduler (no domain affinity, or podAffinity on
    the clique label), once it has bound what it can and marked the rest Unschedulable: how many groups
    ended whole in one domain, split across domains, or partly bound (pods bound, GPUs held, the group
    unable to run); and the GPUs of the whole ones."""
    kubectl(f, "create", "namespace", NS, check=False)
    pods = _bench_pods(sizes, affinity)
    apply_yaml(f, pods)

    def unschedulable(p: dict[str, Any]) -> bool:
        cond = next((x for x in p["status"].get("conditions") or [] if x["type"] == "PodScheduled"), None)
        return bool(cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable")

    last: list[Any] = [None, 0.0]

    def settled() -> list[dict[str, Any]] | None:
        items = get_json(f, "pods", "-n", NS, "-l", "bench-group")["items"]
        if len(items) != len(pods) or not all(p["spec"].get("nodeName") or unschedulable(p) for p in items):
            return None
        bound = sorted(p["metadata"]["name"] for p in items if p["spec"].get("nodeName"))
        if bound != last[0]:  # nothing bound for 10 s: the scheduler has done what it can
            last[0], last[1] = bound, time.monotonic()
            return None
        return items if time.monotonic() - last[1] >= 10 or len(bound) == len(items) else None

    items = wait_for("every bench pod scheduled or unschedulable", settled, timeout=300, interval=2)
    cliques = {
        n["metadata"]["name"]: n["metadata"]["labels"][CLIQUE_LABEL] for n in get_json(f, "nodes")["items"]
    }
    spans: dict[str, set[str]] = {}
    bound: dict[str, int] = {}
    for p in items:
        g = p["metadata"]["labels"]["bench-group"]
        spans.setdefault(g, set())
        if p["spec"].get("nodeName"):
            spans[g].add(cliques[p["spec"]["nodeName"]])
            bound[g] = bound.get(g, 0) + 1
    kubectl(f, "delete", "pods", "-n", NS, "-l", "bench-group", "--wait=true")
    _wait_gone(f, "bench-group")
    whole = split = partial = 0
    gpus = stranded = 0
    for i, size in enumerate(sizes):
        n, members = bound.get(str(i), 0), max(1, size // 4)
        if 0 < n < members:
            partial += 1
            stranded += n * min(size, 4)
        elif n == members and len(spans[str(i)]) > 1:
            split += 1
        elif n == members:
            whole += 1
            gpus += size
    multi = [i for i, g in enumerate(sizes) if g > 4]
    return {
        "groups": len(sizes),
        "multi_node_groups": len(multi),
        "whole": whole,
        "split_across_domains": split,
        "partly_bound": partial,
        "gpus_in_whole_groups": gpus,
        "gpus_held_by_partly_bound_groups": stranded,
    }


def planner(f: Factory, sizes: list[int]) -> dict[str, Any]:
    """tokenfab's best fit, first fit (in order) and the exact optimum (order ignored) on the factory's
    empty racks."""
    nodes = [node_facts(n) for n in get_json(f, "nodes")["items"]]
    domains = snapshot(nodes, {}, {GPU_RESOURCE: 4}, Constraints(CLIQUE_LABEL, GPU_RESOURCE))
    shapes = [GroupShape(gpus=g, gpus_per_node=4) for g in sizes]
    out = {}
    for name, p in (
        ("best_fit", packing.sequential(domains, shapes, None)),
        ("first_fit", packing.sequential(domains, shapes, first_fit)),
        ("optimal", packing.optimal(domains, shapes)),
    ):
        out[name] = {
            "placed": p.groups,
            "gpus": p.gpus,
            "rejected_gpus": sum(sizes) - p.gpus if name != "optimal" else None,
            "proved_optimal": p.optimal,
            "split_across_domains": 0,
        }
    return out


def placement(f: Factory, seeds: range = range(5)) -> dict[str, Any]:
    runs = []
    for seed in seeds:
        sizes = mixed_sequence(seed, budget=280)
        runs.append(
            {
                "seed": seed,
                "sizes": sizes,
                "kube_scheduler": kube_scheduler(f, sizes, affinity=False),
                "kube_scheduler_pod_affinity": kube_scheduler(f, sizes, affinity=True),
                **planner(f, sizes),
            }
        )

    def total(contestant: str, key: str) -> int:
        return sum(r[contestant][key] for r in runs)

    return {
        "runs": runs,
        "total_multi_node_groups": total("kube_scheduler", "multi_node_groups"),
        "total_groups": sum(len(r["sizes"]) for r in runs),
        "total_gpus_asked": sum(sum(r["sizes"]) for r in runs),
        **{
            name: {
                "split_across_domains": total(name, "split_across_domains"),
                "partly_bound": total(name, "partly_bound"),
                "gpus_in_whole_groups": total(name, "gpus_in_whole_groups"),
                "gpus_held_by_partly_bound_groups": total(name, "gpus_held_by_partly_bound_groups"),
            }
            for name in ("kube_scheduler", "kube_scheduler_pod_affinity")
        },
        **{name: {"gpus": total(name, "gpus")} for name in ("best_fit", "first_fit", "optimal")},
        "optimal_proved": all(r["optimal"]["proved_optimal"] for r in runs),
    }


def report(result: dict[str, Any]) -> str:
    a, p = result["apply_to_ready"], result["placement"]
    ks, ka = p["kube_scheduler"], p["kube_scheduler_pod_affinity"]

    def row(name: str, r: dict[str, Any]) -> str:
        gpus = r.get("gpus_in_whole_groups", r.get("gpus"))
        return f"  {name:34} {r.get('split_across_domains', 0):>6} {r.get('partly_bound', 0):>13} {gpus:>21}"

    return "\n".join(
        [
            f"apply -> Ready, {a['pods']} pods / {a['gpus']} GPUs (median of {len(a['tokenfab_seconds'])}):",
            f"  tokenfab ModelDeployment  {a['median_tokenfab']:>6} s   {a['tokenfab_seconds']}"
            f"   (groups split across domains: {a['tokenfab_split_groups']})",
            f"  plain Deployment (floor)  {a['median_plain']:>6} s   {a['plain_deployment_seconds']}",
            f"  overhead vs floor         {a['overhead_vs_floor']}x",
            *(
                [
                    f"  same gang, no operator    {a['median_gang_floor']:>6} s   {a['gang_floor_seconds']}",
                    f"  overhead vs gang floor    {a['overhead_vs_gang_floor']}x",
                ]
                if "gang_floor_seconds" in a
                else []
            ),
            f"placement of mixed group sequences on the factory's racks ({len(p['runs'])} sequences, "
            f"{p['total_groups']} groups, {p['total_multi_node_groups']} multi-node, "
            f"{p['total_gpus_asked']} GPUs):",
            f"  {'':34} {'split':>6} {'partly bound':>13} {'GPUs in whole groups':>21}",
            row("kube-scheduler, no affinity", ks),
            row("kube-scheduler, podAffinity clique", ka)
            + f"   ({ka['gpus_held_by_partly_bound_groups']} GPUs held by partly bound groups)",
            row("tokenfab best fit (in order)", p["best_fit"]),
            row("first fit (in order)", p["first_fit"]),
            row("exact optimum (order ignored)", p["optimal"])
            + ("" if p["optimal_proved"] else "   (not proved optimal within the time limit)"),
        ]
    )


def run(f: Factory, trials: int = 3, seeds: range = range(5)) -> dict[str, Any]:
    return {
        "benchmark": "operator",
        "apply_to_ready": apply_to_ready(f, trials),
        "placement": placement(f, seeds),
    }


def compare(f: Factory, ref: str, rounds: int = 3, port: int = 31590) -> dict[str, Any]:
    """Apply -> Ready with this checkout's operator and with the operator of `ref` (a git worktree),
    alternated on one factory, `rounds` times each, each round 3 trials against the floor."""
    install_crds(f)
    builds = {"this_checkout": ROOT / "operator", ref: baseline_checkout(ref) / "operator"}
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in builds}
    for _ in range(rounds):
        for name, path in builds.items():
            operator_up(f, port, extra_env={"PYTHONPATH": str(path)}, what="operator healthy")
            r = apply_to_ready(f)
            print(
                f"  {name:14} tokenfab {r['tokenfab_seconds']} floor {r['plain_deployment_seconds']} "
                f"gang floor {r.get('gang_floor_seconds')}"
            )
            out[name].append(r)
            f.stop_extra("operator")
    summary = {
        name: against_floor(
            [x for r in rs for x in r["tokenfab_seconds"]],
            [x for r in rs for x in r["plain_deployment_seconds"]],
            [x for r in rs for x in r.get("gang_floor_seconds", [])],
        )
        for name, rs in out.items()
    }
    return {"benchmark": "operator_compare", "ref": ref, "rounds": rounds, "trials_per_round": 3, **summary}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        description="The reconciler benchmarks on a 4-rack factory of their own (apply -> Ready against its "
        "floors, placement against kube-scheduler and the exact optimum), or with --compare-ref, apply -> "
        "Ready of this checkout's operator against an earlier commit's, alternated."
    )
    ap.add_argument("--compare-ref", default=None, help="the earlier commit whose operator to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=3, help="apply -> Ready trials (without --compare-ref)")
    ap.add_argument("--port-base", type=int, default=31500)
    ap.add_argument("--out", type=Path, default=record.RESULTS)
    args = ap.parse_args(argv)
    started = time.time()
    run_dir = Path(tempfile.mkdtemp(prefix="tokenfab-operator-bench-"))
    f = Factory(FactoryConfig(run_dir=run_dir, racks=4, port_base=args.port_base), say=print)
    f.up()
    port = args.port_base + 90
    try:
        if args.compare_ref:
            result = compare(f, args.compare_ref, args.rounds, port=port)
        else:
            install_crds(f)
            operator_up(f, port, what="operator healthy")
            result = run(f, args.trials)
            f.stop_extra("operator")
    finally:
        f.down()
    name = "operator_compare" if args.compare_ref else "operator"
    path = record.save(name, result, args.out, "e2e.bench.operator_bench", argv, started)
    if args.compare_ref:
        for key in (k for k in result if isinstance(result[k], dict)):
            r = result[key]
            print(
                f"{key:14} median {r['median_tokenfab']} s vs floor {r['median_plain']} s: "
                f"{r['overhead_vs_floor']}x; vs gang floor {r.get('median_gang_floor')} s: "
                f"{r.get('overhead_vs_gang_floor')}x"
            )
    else:
        print(report(result))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
