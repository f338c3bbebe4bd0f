"""The fleet at AI-factory scale: N racks, M mixed ModelDeployments applied in one `kubectl apply`.

For the operator under test (this checkout) and, as baselines measured in the same run on the same
factory, (a) the operator of an earlier commit (`--baseline-ref`, run from a git worktree, capped at
`--baseline-cap` seconds) and (b) the control-plane floor (plain Deployments of the same GPU pods, no
operator), it records:

- time from apply until every deployment is Ready (and the count Ready over time);
- the operator's peak RSS and CPU share while converging and at steady state (idle, over `--idle`
  seconds, never less than one resync period and 5 s), beside kube-controller-manager's CPU share over
  the same window;
- reconcile pass durations (p50/p99, from the operator's own histogram) and API requests per idle pass
  (writes and reads per pass, from its request counters).

The baseline operator runs with its own CRDs, and the run fails loudly when it does not make every
deployment Ready (a baseline that cannot run measures nothing). Saved (e2e/record.py) to
e2e/bench/results/scale.json and its history copy (or --out DIR); nothing passes or fails on a time.

    python -m e2e.bench.scale_bench                      # 64 racks, 200 deployments (about 5 minutes)
    python -m e2e.bench.scale_bench --racks 8 --deployments 25 --no-baseline-ref   # a smoke run
    python -m e2e.bench.scale_bench --racks 128 --deployments 600 --no-baseline-ref --repeat 2 \
        --idle 120 --name scale_128                      # the moonshot's size, twice (about 30 minutes)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from e2e import helpers, record
from e2e.fleetmix import SCALE_MIX, asked_gpus, fleet, worker_pods
from e2e.helpers import gpu_deployment, install_crds, repeat_for, wait_for, wait_healthy
from tokenfab.planning import contract
from tokenfab_factory.config import FactoryConfig
from tokenfab_factory.factory import Factory

ROOT = record.ROOT
NS = "scale"
TICK = os.sysconf("SC_CLK_TCK")
CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")
# One apply of the whole fleet (hundreds of objects) on a loaded factory may take minutes.
kubectl = functools.partial(helpers.kubectl, timeout=600)
get_json = functools.partial(helpers.get_json, timeout=600)


# ------------------------------------------------------------------------------------ process figures


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def memory(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


class Sampler:
    """CPU and memory of a set of processes, sampled on demand. A peak is the highest VmRSS sampled while
    this sampler ran (`fresh`: processes started for the run, whose lifetime high VmHWM counts too; a
    control-plane process's VmHWM may come from an earlier run)."""

    def __init__(self, pids: dict[str, int], fresh: tuple[str, ...] = ()) -> None:
        self.pids = pids
        self.fresh = fresh
        self.peak_rss: dict[str, int] = dict.fromkeys(pids, 0)
        self.start_rss = {name: memory(pid).get("VmRSS", 0) for name, pid in pids.items()}

    def cpu(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def sample(self) -> None:
        for name, pid in self.pids.items():
            m = memory(pid)
            hwm = m.get("VmHWM", 0) if name in self.fresh else 0
            self.peak_rss[name] = max(self.peak_rss[name], hwm, m.get("VmRSS", 0))

    def rss_mb(self) -> dict[str, dict[str, float]]:
        return {
            name: {"start": round(self.start_rss[name] / 2**20, 1), "peak": round(peak / 2**20, 1)}
            for name, peak in self.peak_rss.items()
        }


# ------------------------------------------------------------------------------- operator's own metrics


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def metric_sums(text: str) -> dict[str, float]:
    """Passes, requests by kind, and the pass-duration histogram summed over deployments."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            v = float(value)
        except ValueError:
            continue
        if name.startswith("tokenfab_reconciles_total"):
            out["passes"] = out.get("passes", 0) + v
        elif name.startswith("tokenfab_parked_groups_total"):
            on = re.search(r'on="([^"]+)"', name)
            what = f"parked:{on.group(1) if on else '?'}"
            out[what] = out.get(what, 0) + v
        elif name.startswith("tokenfab_api_requests_total"):
            verb = re.search(r'verb="([A-Z]+)"', name)
            resource = re.search(r'resource="([^"]+)"', name)
            kind = verb.group(1) if verb else "?"
            if kind == "WATCH":
                continue
            key = "reads" if kind == "GET" else "writes"
            what = f"by_resource:{key}:{resource.group(1) if resource else '?'}"
            out[what] = out.get(what, 0) + v
            if resource and resource.group(1).startswith("nvlinkdomains"):
                key = f"inventory_{key}"  # the NVLinkDomain inventory's own loop, not a reconcile pass
            elif resource and resource.group(1) == "discovery":
                # API discovery of optional kinds (the DRA driver's, Dynamo's), rechecked in the
                # background every KIND_RECHECK_SECONDS per kind whatever the fleet's size: not a pass
                key = f"discovery_{key}"
            out[key] = out.get(key, 0) + v
        elif name.startswith("tokenfab_reconcile_duration_seconds_bucket"):
            le = re.search(r'le="([^"]+)"', name)
            if le:
                out[f"le={le.group(1)}"] = out.get(f"le={le.group(1)}", 0) + v
        elif name.startswith("tokenfab_pass_writes_duration_seconds_bucket"):
            le = re.search(r'le="([^"]+)"', name)
            if le:
                out[f"writes:le={le.group(1)}"] = out.get(f"writes:le={le.group(1)}", 0) + v
    return out


def quantile(sums: dict[str, float], q: float) -> float | None:
    buckets = sorted(
        (float("inf") if k[3:] == "+Inf" else float(k[3:]), v) for k, v in sums.items() if k.startswith("le=")
    )
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_n = 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_n) / max(n - prev_n, 1e-9))
        prev_le, prev_n = le, n
    return prev_le


# ----------------------------------------------------------------------------------------- the runs


STRAGGLERS: dict[str, str] = {}  # deployment -> its last Ready message while it was not Ready
READY_AT: dict[str, float] = {}  # deployment -> when it was first seen Ready


def ready_count(f: Factory) -> tuple[int, int]:
    items = get_json(f, "mdep", "-n", NS)["items"]
    ready = 0
    for md in items:
        cond = next(
            (cd for cd in (md.get("status") or {}).get("conditions", []) if cd["type"] == "Ready"), None
        )
        if cond and cond["status"] == "True":
            ready += 1
            READY_AT.setdefault(md["metadata"]["name"], time.monotonic())
        elif cond:
            STRAGGLERS[md["metadata"]["name"]] = f"{cond['reason']}: {cond['message']}"[:400]
    return ready, len(items)


def clean(f: Factory) -> None:
    kubectl(f, "delete", "mdep", "--all", "-n", NS, "--wait=false", check=False)
    kubectl(f, "delete", "deployments", "--all", "-n", NS, "--wait=false", check=False)
    # An earlier operator's finalizer would wait for that (stopped) operator forever.
    for md in get_json(f, "mdep", "-n", NS)["items"]:
        if md["metadata"].get("finalizers"):
            kubectl(
                f,
                "patch",
                "mdep",
                md["metadata"]["name"],
                "-n",
                NS,
                "--type=merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                check=False,
            )

    def empty() -> bool:
        left = get_json(f, "pods", "-n", NS)["items"]
        mds = get_json(f, "mdep", "-n", NS)["items"]
        return not left and not mds

    wait_for("the namespace emptied", empty, timeout=900, interval=3)
    # Then what the garbage collector removes after its owners (Services, EndpointSlices, claims, ...): a
    # run that starts before it is done shares the API server with those deletes (a second 128-rack run
    # sent its first 166 deployments in 5 minutes, the first 270 in 2.3).
    wait_for(
        "the garbage collector done",
        lambda: not {k: v for k, v in namespace_objects(f).items() if k != "event"},
        timeout=900,
        interval=5,
    )


RESYNC_SECONDS = 30  # the operator's resync in these runs (TOKENFAB_RESYNC_SECONDS)


def run_operator(
    f: Factory,
    docs: list[dict[str, Any]],
    name: str,
    port: int,
    cap: float,
    idle: float,
    pythonpath: str | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start an operator, apply the fleet, follow it until every deployment is Ready (or `cap`), then
    measure `idle` seconds of steady state."""
    argv = Factory.operator_argv(port)
    penv = {"TOKENFAB_RESYNC_SECONDS": str(RESYNC_SECONDS), **(env or {})}
    if pythonpath:
        penv["PYTHONPATH"] = pythonpath
    pid = f.start_extra(name, argv, env=penv)
    state = f.read_state()
    assert state is not None
    sampler = Sampler({"operator": pid, **{c: state.pids[c] for c in CONTROL_PLANE}}, fresh=("operator",))
    wait_healthy(port, f"{name} healthy", timeout=120, interval=1)
    time.sleep(3)
    text = yaml.safe_dump_all(docs)
    api0 = apiserver_metrics(f)
    requests0 = api0["requests"]
    ops0 = _operator_sums(port)
    cpu0, t0 = sampler.cpu(), time.monotonic()
    kubectl(f, "apply", "--server-side", "--field-manager=gitops", "-f", "-", input=text)
    applied = time.monotonic() - t0
    timeline: list[tuple[float, int]] = []

    def every_one_ready() -> bool:
        sampler.sample()
        ready, total = ready_count(f)
        timeline.append((round(time.monotonic() - t0, 1), ready))
        return total == len(docs) and ready == total

    all_ready = None
    try:
        wait_for("every deployment Ready", every_one_ready, timeout=t0 + cap - time.monotonic(), interval=2)
        all_ready = round(time.monotonic() - t0, 1)
    except AssertionError:
        pass
    cpu1, t1 = sampler.cpu(), time.monotonic()
    api1 = apiserver_metrics(f)
    requests1 = api1["requests"]
    ops1 = _operator_sums(port)
    objects = namespace_objects(f)
    last = sorted(READY_AT, key=lambda n: -READY_AT[n])[:3]
    stragglers = {n: STRAGGLERS.get(n, "") for n in last}
    STRAGGLERS.clear()
    READY_AT.clear()
    out: dict[str, Any] = {
        "operator": name,
        "apply_seconds": round(applied, 1),
        "all_ready_seconds": all_ready,
        "ready_at_end": timeline[-1][1] if timeline else 0,
        "timeline": timeline,
        "converging_cpu_share": {k: round((cpu1[k] - cpu0[k]) / (t1 - t0), 3) for k in cpu0},
        # What the API server served while the fleet converged (every client), by verb and resource.
        "apiserver_requests": top_requests(requests0, requests1),
        "last_to_be_ready": stragglers,  # what the slowest deployments waited for
        # every client's requests and watch events while it converged, and the objects left, per deployment
        "per_deployment": per_deployment(api0, api1, objects, len(docs)),
        # the operator's own share: passes, requests by resource, groups parked by what they waited for
        "operator_per_deployment": operator_costs(ops0, ops1, len(docs)),
    }
    if all_ready is not None and idle > 0:
        time.sleep(5)
        m0, c0, s0 = metric_sums(scrape(port + 1)), sampler.cpu(), time.monotonic()
        # An idle operator passes only on its resync: the window holds at least one whatever `idle` says
        # (a shorter one can fall between two resyncs and count no pass at all).
        repeat_for(max(idle, RESYNC_SECONDS + 5), 2, sampler.sample)
        m1, c1, s1 = metric_sums(scrape(port + 1)), sampler.cpu(), time.monotonic()
        passes = m1.get("passes", 0) - m0.get("passes", 0)
        window = {k: v - m0.get(k, 0.0) for k, v in m1.items()}
        out["steady"] = {
            "seconds": round(s1 - s0, 1),
            # the passes of this window alone (the histogram's buckets counted from its start)
            "reconcile_seconds": {
                "p50": _round(quantile(window, 0.5)),
                "p99": _round(quantile(window, 0.99)),
            },
            "cpu_share": {k: round((c1[k] - c0[k]) / (s1 - s0), 4) for k in c0},
            "passes": passes,
            "writes_per_pass": round((m1.get("writes", 0) - m0.get("writes", 0)) / passes, 4)
            if passes
            else None,
            "reads_per_pass": round((m1.get("reads", 0) - m0.get("reads", 0)) / passes, 4)
            if passes
            else None,
            "inventory_writes": m1.get("inventory_writes", 0) - m0.get("inventory_writes", 0),
            "discovery_reads": m1.get("discovery_reads", 0) - m0.get("discovery_reads", 0),
        }
    try:
        sums = metric_sums(scrape(port + 1))
        out["reconcile_seconds"] = {
            "p50": _round(quantile(sums, 0.5)),
            "p99": _round(quantile(sums, 0.99)),
            "passes": sums.get("passes"),
        }
        # A pass hands its writes to the writer; the API server's answers and the status follow on a
        # finisher thread (their time, from hand-over to the pass complete).
        writes = {k.removeprefix("writes:"): v for k, v in sums.items() if k.startswith("writes:")}
        out["pass_writes_seconds"] = {
            "p50": _round(quantile(writes, 0.5)),
            "p99": _round(quantile(writes, 0.99)),
            "passes": max(writes.values(), default=0.0),
        }
        out["api_requests"] = {"reads": sums.get("reads"), "writes": sums.get("writes")}
    except OSError as exc:  # an older operator may expose fewer figures
        out["reconcile_seconds"] = {"error": str(exc)}
    sampler.sample()
    out["peak_rss_mb"] = {k: round(v / 2**20, 1) for k, v in sampler.peak_rss.items()}
    out["rss_mb"] = sampler.rss_mb()
    f.stop_extra(name)
    return out


WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
READ_VERBS = frozenset({"GET", "LIST"})
# What a deployment leaves in its namespace, counted by listing (`kubectl get`), not from the API server's
# object-count gauge (refreshed once a minute).
COUNTED_KINDS = (
    "pods",
    "services",
    "endpointslices.discovery.k8s.io",
    "serviceaccounts",
    "roles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    "configmaps",
    "deployments.apps",
    "replicasets.apps",
    "poddisruptionbudgets.policy",
    "computedomains.resource.nvidia.com",
    "resourceclaimtemplates.resource.k8s.io",
    "resourceclaims.resource.k8s.io",
    "podgroups.scheduling.k8s.io",
    "events",
)


# What every namespace holds of its own (Kubernetes' controllers make them): not the fleet's.
NAMESPACE_OWN = frozenset({"serviceaccount/default", "configmap/kube-root-ca.crt"})


def apiserver_metrics(f: Factory) -> dict[str, dict[str, float]]:
    """From the API server's /metrics: apiserver_request_total summed by verb and resource (and
    subresource), and apiserver_watch_events_total (events sent to watchers) by resource."""
    import ssl

    ctx = ssl.create_default_context(cafile=str(f.pki.ca_crt))
    ctx.load_cert_chain(str(f.pki.admin_crt), str(f.pki.admin_key))
    requests: dict[str, float] = {}
    watch_events: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"{f.apiserver_url}/metrics", timeout=30, context=ctx) as r:
            text = r.read().decode()
    except OSError:
        return {"requests": requests, "watch_events": watch_events}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{"):
            name, _, value = line.rpartition(" ")
            labels = dict(re.findall(r'(\w+)="([^"]*)"', name))
            key = f"{labels.get('verb')} {labels.get('resource')}" + (
                f"/{labels['subresource']}" if labels.get("subresource") else ""
            )
            requests[key] = requests.get(key, 0.0) + float(value)
        elif line.startswith("apiserver_watch_events_total{"):
            name, _, value = line.rpartition(" ")
            labels = dict(re.findall(r'(\w+)="([^"]*)"', name))
            what = labels.get("resource") or labels.get("kind") or "?"
            watch_events[what] = watch_events.get(what, 0.0) + float(value)
    return {"requests": requests, "watch_events": watch_events}


def _operator_sums(port: int) -> dict[str, float]:
    try:
        return metric_sums(scrape(port + 1))
    except OSError:  # an older operator may expose fewer figures
        return {}


def operator_costs(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, Any]:
    """The operator's own passes and requests while the fleet converged, per deployment."""
    d = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}
    by: dict[str, dict[str, float]] = {"reads": {}, "writes": {}}
    for k, v in d.items():
        if k.startswith("by_resource:"):
            _, what, resource = k.split(":", 2)
            by[what][resource] = round(v / n, 2)
    return {
        "passes": round(d.get("passes", 0.0) / n, 2),
        "writes": round(sum(by["writes"].values()), 2),
        "reads": round(sum(by["reads"].values()), 2),
        "writes_by_resource": dict(sorted(by["writes"].items(), key=lambda kv: -kv[1])),
        "reads_by_resource": dict(sorted(by["reads"].items(), key=lambda kv: -kv[1])),
        "parked_groups": {
            k.removeprefix("parked:"): round(v / n, 2) for k, v in d.items() if k.startswith("parked:")
        },
    }


def namespace_objects(f: Factory) -> dict[str, int]:
    """The objects in the benchmark's namespace, by resource (one list of each)."""
    counts: dict[str, int] = {}
    for kind in COUNTED_KINDS:  # (one by one: a kind the cluster does not serve fails its own list only)
        out = kubectl(f, "get", kind, "-n", NS, "-o", "name", check=False)
        for line in out.stdout.splitlines():
            if line in NAMESPACE_OWN:
                continue
            what = line.split("/", 1)[0]
            counts[what] = counts.get(what, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def per_deployment(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], objects: dict[str, int], n: int
) -> dict[str, Any]:
    """What the fleet cost the API server while it converged, per deployment (every client's requests:
    the operator's, the controllers', the scheduler's, the simulated kubelets'), and what it left."""

    def delta(kind: str) -> dict[str, float]:
        a, b = after[kind], before[kind]
        return {k: v - b.get(k, 0.0) for k, v in a.items() if v - b.get(k, 0.0) > 0}

    requests, events = delta("requests"), delta("watch_events")
    writes = {k: v for k, v in requests.items() if k.split(" ")[0] in WRITE_VERBS}
    reads = {k: v for k, v in requests.items() if k.split(" ")[0] in READ_VERBS}

    def each(d: dict[str, float], top: int = 12) -> dict[str, float]:
        return {k: round(v / n, 2) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]}

    return {
        "writes": round(sum(writes.values()) / n, 1),
        "reads": round(sum(reads.values()) / n, 1),
        "watch_events": round(sum(events.values()) / n, 1),
        "objects": round(sum(v for k, v in objects.items() if k != "event") / n, 1),
        "events": round(objects.get("event", 0) / n, 1),
        "writes_by_resource": each(writes),
        "reads_by_resource": each(reads),
        "watch_events_by_resource": each(events),
        "objects_by_resource": {k: round(v / n, 2) for k, v in objects.items()},
    }


def top_requests(before: dict[str, float], after: dict[str, float], n: int = 15) -> dict[str, float]:
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return dict(sorted(((k, round(v)) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1])[:n])


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def plain_floor(f: Factory, docs: list[dict[str, Any]], cap: float) -> dict[str, Any]:
    """The same worker pods as plain Deployments (one per ModelDeployment, GPUs per pod as its groups'),
    no operator: the control plane's own time to run them."""
    from e2e.fleetmix import wanted_groups

    by_dep: dict[str, list[int]] = {}
    for w in wanted_groups(docs):
        by_dep.setdefault(w.deployment, []).extend([min(w.gpus, 4)] * -(-w.gpus // 4))
    plain = []
    for dep, pods in by_dep.items():
        for gpus in sorted(set(pods)):
            n = pods.count(gpus)
            app = f"{dep}-g{gpus}"
            plain.append(gpu_deployment(app, NS, replicas=n, gpus=gpus))
    state = f.read_state()
    assert state is not None
    sampler = Sampler({c: state.pids[c] for c in CONTROL_PLANE})
    api0, cpu0 = apiserver_metrics(f), sampler.cpu()
    t0 = time.monotonic()
    kubectl(f, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(plain))

    def available() -> bool:
        sampler.sample()
        items = get_json(f, "deployments", "-n", NS)["items"]
        return len(items) == len(plain) and all(
            (d.get("status") or {}).get("availableReplicas") == d["spec"]["replicas"] for d in items
        )

    try:
        wait_for("plain Deployments available", available, timeout=cap, interval=2)
        took: float | None = round(time.monotonic() - t0, 1)
    except AssertionError:
        took = None
    cpu1, t1 = sampler.cpu(), time.monotonic()
    api1 = apiserver_metrics(f)
    return {
        "deployments": len(plain),
        "pods": sum(d["spec"]["replicas"] for d in plain),
        "all_available_seconds": took,
        "converging_cpu_share": {k: round((cpu1[k] - cpu0[k]) / (t1 - t0), 3) for k in cpu0},
        "rss_mb": sampler.rss_mb(),
        # per ModelDeployment of the fleet whose pods these are (the same divisor as the operator's run)
        "per_deployment": per_deployment(api0, api1, namespace_objects(f), len(docs)),
    }


# What the operator writes for a deployment (its children, owned by the ModelDeployment), in the order
# the objects floor sends them: everything else first, the pods once their channel templates exist.
OPERATOR_KINDS = (
    "serviceaccounts",
    "roles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    "configmaps",
    "services",
    "poddisruptionbudgets.policy",
    "deployments.apps",
    "computedomains.resource.nvidia.com",
    "podgroups.scheduling.k8s.io",
    "pods",
)
WRITERS = 16  # the operator's writer threads (tokenfab.adapters.kube.Kube), as many kubectl at once


def operator_objects(f: Factory) -> list[dict[str, Any]]:
    """The objects the operator made for the fleet (owned by a ModelDeployment), as a client would send
    them again: name, labels, annotations and spec; no owner (the objects floor has no ModelDeployment),
    no status, no node (the scheduler binds), and no readiness gate (the operator's routing sets it: a
    write of the operator's protocol, not an object)."""
    out = []
    for kind in OPERATOR_KINDS:
        got = kubectl(f, "get", kind, "-n", NS, "-o", "json", check=False)
        if got.returncode != 0:  # (a kind this cluster does not serve)
            continue
        for obj in yaml.safe_load(got.stdout)["items"]:
            meta = obj["metadata"]
            if not any(r.get("kind") == "ModelDeployment" for r in meta.get("ownerReferences") or []):
                continue
            keep = {k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta}
            doc = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
            doc["metadata"] = keep
            if obj["kind"] == "Pod":
                doc["spec"] = {
                    k: v for k, v in obj["spec"].items() if k not in ("nodeName", "readinessGates")
                }
            out.append(doc)
    return out


def send_sharded(f: Factory, docs: list[dict[str, Any]], shards: int = WRITERS) -> None:
    """`kubectl apply --server-side` of `docs` by `shards` kubectl processes at once."""
    from concurrent.futures import ThreadPoolExecutor

    parts = [docs[i::shards] for i in range(shards)]
    # (as JSON: YAML would leave a hash such as 4e12345678 unquoted, and kubectl read it as a number)
    lists = [json.dumps({"apiVersion": "v1", "kind": "List", "items": p}) for p in parts if p]
    with ThreadPoolExecutor(shards) as pool:
        done = [
            pool.submit(kubectl, f, "apply", "--server-side", "--field-manager=floor", "-f", "-", input=text)
            for text in lists
        ]
        for d in done:
            d.result()


def objects_floor(f: Factory, objects: list[dict[str, Any]], n: int, cap: float) -> dict[str, Any]:
    """The objects tokenfab made for the fleet, sent again with no operator running, by as many kubectl
    at once as the operator has writers: the control plane's own time to run them (every object but the
    pods first, then the pods once every ComputeDomain has its channel template, as the operator parks
    them). What is left above it is the operator's own."""
    pods = [o for o in objects if o["kind"] == "Pod"]
    rest = [o for o in objects if o["kind"] != "Pod"]
    domains = sum(1 for o in rest if o["kind"] == "ComputeDomain")
    frontends = sum(1 for o in rest if o["kind"] == "Deployment")
    state = f.read_state()
    assert state is not None
    sampler = Sampler({c: state.pids[c] for c in CONTROL_PLANE})
    api0, cpu0 = apiserver_metrics(f), sampler.cpu()
    t0 = time.monotonic()
    send_sharded(f, rest)
    target = f"{contract.COMPUTE_DOMAIN_TARGET_LABEL}={contract.COMPUTE_DOMAIN_TARGET_WORKLOAD}"

    def templates() -> bool:
        sampler.sample()
        got = kubectl(f, "get", "resourceclaimtemplates", "-n", NS, "-l", target, "-o", "name", check=False)
        return len(got.stdout.split()) >= domains

    wait_for("every channel template", templates, timeout=cap, interval=2)
    send_sharded(f, pods)
    sent = round(time.monotonic() - t0, 1)

    def all_ready() -> bool:
        sampler.sample()
        items = get_json(f, "pods", "-n", NS)["items"]
        ready = sum(
            1
            for p in items
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
        )
        return ready >= len(pods) + frontends

    took: float | None
    try:
        wait_for("the operator's objects Ready", all_ready, timeout=t0 + cap - time.monotonic(), interval=2)
        took = round(time.monotonic() - t0, 1)
    except AssertionError:
        took = None
    cpu1, t1 = sampler.cpu(), time.monotonic()
    api1 = apiserver_metrics(f)
    return {
        "objects": len(objects),
        "pods": len(pods),
        "frontends": frontends,
        "writers": WRITERS,
        "sent_seconds": sent,
        "all_ready_seconds": took,
        "converging_cpu_share": {k: round((cpu1[k] - cpu0[k]) / (t1 - t0), 3) for k in cpu0},
        "rss_mb": sampler.rss_mb(),
        "per_deployment": per_deployment(api0, api1, namespace_objects(f), n),
    }


def clean_objects(f: Factory) -> None:
    """The objects floor's objects deleted (they have no owner to be collected with), then waited for."""
    selector = f"{contract.MANAGED_BY}={contract.MANAGED_BY_VALUE}"
    for kind in OPERATOR_KINDS:
        kubectl(f, "delete", kind, "-n", NS, "-l", selector, "--wait=false", check=False)
    wait_for(
        "the objects floor's objects gone",
        lambda: not {k: v for k, v in namespace_objects(f).items() if k != "event"},
        timeout=900,
        interval=5,
    )


def kubectl_floor(f: Factory, docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The time `kubectl apply` takes to send the fleet with no operator running (the floor a user's
    apply cannot beat), then the deployments deleted again."""
    t0 = time.monotonic()
    kubectl(f, "apply", "--server-side", "--field-manager=gitops", "-f", "-", input=yaml.safe_dump_all(docs))
    took = round(time.monotonic() - t0, 1)
    clean(f)
    return {"apply_seconds": took, "deployments": len(docs)}


def baseline_checkout(ref: str) -> Path:
    path = Path(tempfile.gettempdir()) / f"tokenfab-baseline-{ref}"
    if not (path / "operator" / "tokenfab").exists():
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--force", "--detach", str(path), ref], check=True
        )
    return path


def run(
    racks: int,
    deployments: int,
    port_base: int,
    run_dir: Path,
    baseline_ref: str | None,
    baseline_cap: float,
    floor: bool,
    idle: float,
    cap: float,
    seed: int = 7,
    repeat: int = 1,
    objects: bool = True,
) -> dict[str, Any]:
    f = Factory(FactoryConfig(run_dir=run_dir, racks=racks, port_base=port_base), say=print)
    t0 = time.monotonic()
    state = f.up(timeout=900)
    result: dict[str, Any] = {
        "benchmark": "scale",
        "racks": racks,
        "nodes": racks * 18,
        "gpus": racks * 72,
        "factory_ready_seconds": state.ready_seconds,
    }
    try:
        install_crds(f)
        kubectl(f, "create", "namespace", NS, check=False)
        docs = fleet(deployments, NS, seed=seed, prefix="s", mix=SCALE_MIX)
        result["fleet"] = {
            "deployments": len(docs),
            "gpus": asked_gpus(docs),
            "worker_pods": worker_pods(docs),
        }
        port = port_base + 20
        runs: dict[str, Any] = {}
        if baseline_ref:
            path = baseline_checkout(baseline_ref)
            print(
                f"baseline: the operator of {baseline_ref} ({path}), its own CRDs, cap {baseline_cap:.0f} s"
            )
            # Its own CRDs: today's would default fields its models do not know, and it would refuse every
            # spec for that reason alone (a version mismatch, not a measurement).
            kubectl(f, "apply", "--server-side", "--force-conflicts", "-f", str(path / "crds"))
            runs["baseline_operator"] = {
                "ref": baseline_ref,
                **run_operator(f, docs, "baseline-operator", port, baseline_cap, 0, str(path / "operator")),
            }
            clean(f)
            kubectl(f, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
            base = runs["baseline_operator"]
            if base["ready_at_end"] != len(docs):
                raise RuntimeError(
                    f"the baseline operator of {baseline_ref} made {base['ready_at_end']} of {len(docs)} "
                    "deployments Ready: it did not run, so there is nothing to compare with "
                    f"({base.get('last_to_be_ready')})"
                )
        print("the floor: kubectl sends the fleet, no operator running")
        result["kubectl_floor"] = kubectl_floor(f, docs)
        print("tokenfab (this checkout)")
        made: list[dict[str, Any]] = []
        for i in range(repeat):  # (again on the same factory: tokenfab, tokenfab_2, ...)
            runs["tokenfab" + (f"_{i + 1}" if i else "")] = run_operator(f, docs, "operator", port, cap, idle)
            if not made and objects:
                made = operator_objects(f)
            clean(f)
        if made:
            print(f"the objects floor: the {len(made)} objects tokenfab made, sent again with no operator")
            runs["tokenfab_objects"] = objects_floor(f, made, len(docs), cap)
            clean_objects(f)
        if floor:
            print("control-plane floor: plain Deployments of the same pods")
            runs["plain_deployments"] = plain_floor(f, docs, cap)
            clean(f)
        result["runs"] = runs
    finally:
        f.down()
    result["total_seconds"] = round(time.monotonic() - t0, 1)
    return result


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['racks']} racks ({result['nodes']} nodes, {result['gpus']} GPUs); fleet: "
        f"{result['fleet']['deployments']} deployments, {result['fleet']['gpus']} GPUs, "
        f"{result['fleet']['worker_pods']} worker pods"
    ]
    floor = result.get("kubectl_floor")
    if floor:
        lines.append(
            f"  kubectl floor      the fleet sent in {floor['apply_seconds']} s with no operator running"
        )
    for name, r in result["runs"].items():
        api = (r.get("rss_mb") or {}).get("kube-apiserver", {})
        cost = r.get("per_deployment")
        if cost:
            lines.append(
                f"  {name:18} per deployment: {cost['objects']} objects, {cost['writes']} writes, "
                f"{cost['reads']} reads, {cost['watch_events']} watch events (every client); "
                f"kube-apiserver CPU {r.get('converging_cpu_share', {}).get('kube-apiserver')}, "
                f"RSS {api.get('start')} -> {api.get('peak')} MB"
            )
        if name == "plain_deployments":
            lines.append(f"  {name:18} all available after {r['all_available_seconds']} s ({r['pods']} pods)")
            continue
        if name == "tokenfab_objects":
            lines.append(
                f"  {name:18} no operator: {r['objects']} objects ({r['pods']} pods) sent by {r['writers']} "
                f"kubectl at once in {r['sent_seconds']} s, all Ready after {r['all_ready_seconds']} s"
            )
            continue
        ours = r.get("operator_per_deployment")
        if ours:
            lines.append(
                f"  {name:18} the operator per deployment: {ours['passes']} passes, {ours['writes']} writes, "
                f"{ours['reads']} reads, parked {ours['parked_groups']}"
            )
        steady = r.get("steady", {})
        lines.append(
            f"  {name:18} all Ready after {r['all_ready_seconds']} s (Ready at end: {r['ready_at_end']}); "
            f"peak RSS {r['peak_rss_mb'].get('operator')} MB; reconcile p50/p99 "
            f"{r.get('reconcile_seconds', {}).get('p50')}/{r.get('reconcile_seconds', {}).get('p99')} s; "
            f"writes answered p50/p99 {r.get('pass_writes_seconds', {}).get('p50')}/"
            f"{r.get('pass_writes_seconds', {}).get('p99')} s; "
            f"steady reconcile p99 {steady.get('reconcile_seconds', {}).get('p99')} s; "
            f"steady CPU {steady.get('cpu_share')}; writes/idle pass {steady.get('writes_per_pass')}; "
            f"reads/idle pass {steady.get('reads_per_pass')}; "
            f"background discovery reads {steady.get('discovery_reads')}"
        )
    lines += goals(result)
    return "\n".join(lines)


def goals(result: dict[str, Any]) -> list[str]:
    """Each run of this checkout against the Steady issue's goals: every deployment Ready within 150 s of
    the first apply and within 1.5x the kubectl floor, the operator under 300 MB, reconcile p99 at most
    0.25 s at steady state."""
    floor = (result.get("kubectl_floor") or {}).get("apply_seconds")
    out = []
    for name, r in result["runs"].items():
        if not name.startswith("tokenfab") or name == "tokenfab_objects":
            continue
        ready = r.get("all_ready_seconds")
        rss = (r.get("rss_mb") or {}).get("operator", {}).get("peak")
        p99 = ((r.get("steady") or {}).get("reconcile_seconds") or {}).get("p99")
        checks = {
            "Ready <= 150 s": ready is not None and ready <= 150,
            "<= 1.5x kubectl floor": ready is not None and floor is not None and ready <= 1.5 * floor,
            "operator < 300 MB": rss is not None and rss < 300,
            "steady reconcile p99 <= 0.25 s": p99 is not None and p99 <= 0.25,
        }
        said = ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in checks.items())
        out.append(f"  goals ({name}: Ready {ready} s, floor {floor} s, {rss} MB, p99 {p99} s): {said}")
        alone = (result["runs"].get("tokenfab_objects") or {}).get("all_ready_seconds")
        if alone is not None and ready is not None:
            out.append(
                f"  {name}: Ready after {ready} s; its objects alone (sent again by {WRITERS} kubectl, no "
                f"operator): {alone} s"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--racks", type=int, default=64)
    ap.add_argument("--deployments", type=int, default=200)
    ap.add_argument("--port-base", type=int, default=30000)  # below the ephemeral range (32768-)
    ap.add_argument("--run-dir", type=Path, default=None)
    # (the baseline runs with its own CRDs; the default is the last commit before the Parity round)
    ap.add_argument("--baseline-ref", default="db23fe8", help="an earlier commit's operator to compare with")
    ap.add_argument("--no-baseline-ref", action="store_true")
    ap.add_argument("--baseline-cap", type=float, default=360.0)
    ap.add_argument("--no-floor", action="store_true")
    ap.add_argument(
        "--no-objects-floor", action="store_true", help="skip sending tokenfab's objects with no operator"
    )
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--cap", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=record.RESULTS, help="directory (<name>.json)")
    ap.add_argument("--name", default="scale", help="the results file's name: scale (64 racks), scale_128")
    ap.add_argument("--repeat", type=int, default=1, help="runs of this checkout's operator, one factory")
    args = ap.parse_args(argv)
    started = time.time()
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="tokenfab-scale-"))
    result = run(
        args.racks,
        args.deployments,
        args.port_base,
        run_dir,
        None if args.no_baseline_ref else args.baseline_ref,
        args.baseline_cap,
        not args.no_floor,
        args.idle,
        args.cap,
        repeat=args.repeat,
        objects=not args.no_objects_floor,
    )
    path = record.save(args.name, result, args.out, "e2e.bench.scale_bench", argv, started)
    print(report(result))
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
