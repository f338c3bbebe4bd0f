"""The launcher's lines in pods' logs, to status: a weights-fetch pod's download so far
(tokenfab.launcher.progress writes it, tokenfab.pod_logs reads it, status.weightsCache.downloads shows it)
and where each worker's weights came from (status.placement[].weights)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import pytest

from tests.planning.test_one_pass import deployment, materialize, nodes_of, snapshot
from tokenfab import pod_logs
from tokenfab.adapters.kube import ApiError
from tokenfab.fleet.facts import PodFacts, pod_facts
from tokenfab.launcher import progress
from tokenfab.planning import contract, launcher_log, weights_cache
from tokenfab.planning.launcher_log import Outcome
from tokenfab.planning.one_pass import plan
from tokenfab.planning.status import placement
from tokenfab.runtime import Memory, Settings

PROGRESS = 'tokenfab-launcher: weights-progress {"bytes": %d, "seconds": %s}'
RESULT = 'tokenfab-launcher: weights-result {"bytes": 2500, "files": 3, "seconds": %s, "source": "%s"}'


def test_the_last_progress_and_result_lines_are_read_and_nothing_else():
    text = "\n".join(
        [
            "engine: starting",
            PROGRESS % (100, 10.0),
            'other-program: weights-progress {"bytes": 7}',  # (another program's words, same marker: read)
            PROGRESS % (900, 20.0),
            RESULT % (41.5, "download"),
            "[TensorRT-LLM] loading",
        ]
    )
    got = launcher_log.read(text)
    assert got.progress == launcher_log.Progress(900, 20.0)
    assert got.result == Outcome("download", 2500, 3, 41.5)
    assert launcher_log.read("no such lines") == launcher_log.LauncherLog()
    # broken or hostile lines give nothing, or zeros, never an exception
    assert launcher_log.read("x: weights-progress {not json").progress is None
    assert launcher_log.read('x: weights-result {"bytes": -5, "source": "cache"}').result == Outcome(
        "cache", 0, 0, 0.0
    )
    assert launcher_log.read('x: weights-result {"bytes": 1}').result is None  # (no source)


def test_a_groups_words_name_its_source_or_each_source_with_its_pods():
    cache, slow, fast = (
        Outcome("cache", 1, 1, 0.0),
        Outcome("download", 1, 1, 312.0),
        Outcome("download", 1, 1, 9.0),
    )
    assert launcher_log.group_words([cache, cache]) == "cache"
    assert launcher_log.group_words([fast, slow, None]) == "download 312 s"  # (the slowest pod's)
    assert launcher_log.group_words([cache, slow, cache, fast]) == "download 312 s on 2, cache on 2"
    assert launcher_log.group_words([None, None]) == ""
    assert launcher_log.downloading_words([]) == ""


def test_a_download_writes_its_bytes_so_far_and_a_last_line_when_it_ends(tmp_path):
    lines: list[str] = []
    (tmp_path / "old").write_bytes(b"o" * 50)  # (there before: not counted)
    seen = threading.Event()

    def emit(line: str) -> None:
        lines.append(line)
        seen.set()

    told: list[bool] = []
    p = progress.Progress(tmp_path, 0.05, emit, told.append)
    p(True)
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "a.incomplete").write_bytes(b"w" * 1000)
    os.symlink(tmp_path / "blobs" / "a.incomplete", tmp_path / "link")  # (a snapshot's link: once)
    assert seen.wait(5)
    p(False)
    assert told == [True, False]  # (the caller's own callback still runs)
    last = launcher_log.read("\n".join(f"tokenfab-launcher: {x}" for x in lines)).progress
    assert last is not None
    assert last.bytes == 1000
    assert progress.interval({progress.ENV_PROGRESS_SECONDS: "nonsense"}) == progress.DEFAULT_SECONDS
    assert progress.interval({progress.ENV_PROGRESS_SECONDS: "2.5"}) == 2.5


CREATED = "2026-11-27T00:00:00Z"


class SyncPool:
    """Runs each read at once (or, `hold`, never: a read still in flight)."""

    def __init__(self) -> None:
        self.hold = False
        self.held: list[tuple[Future[str], Any, tuple[Any, ...]]] = []

    def submit(self, fn: Any, *args: Any) -> Future[str]:
        fut: Future[str] = Future()
        if self.hold:
            self.held.append((fut, fn, args))
            return fut
        try:
            fut.set_result(fn(*args))
        except Exception as exc:
            fut.set_exception(exc)
        return fut


class FakeKube:
    def __init__(self, logs: dict[str, str | Exception]) -> None:
        self.logs = logs
        self.reads: list[tuple[str, str, int | None, int | None]] = []
        self.log_pool = SyncPool()

    def pod_log(
        self,
        namespace: str,
        name: str,
        container: str,
        tail_lines: int | None = None,
        limit_bytes: int | None = None,
    ) -> str:
        self.reads.append((name, container, tail_lines, limit_bytes))
        said = self.logs[name]
        if isinstance(said, Exception):
            raise said
        if tail_lines is not None:
            return "\n".join(said.splitlines()[-tail_lines:])
        return said[:limit_bytes]


class FakeCtx:
    def __init__(self, kube: FakeKube, read: bool = True) -> None:
        self.kube, self.memory, self.settings = kube, Memory(), Settings(read_pod_logs=read)

    def mem(self, _key: Any) -> Memory:
        return self.memory


def _pod(
    name: str, component: str, ready: bool = True, phase: str = "Running", group: str = "", node: str = ""
) -> PodFacts:
    labels = {contract.COMPONENT: component, **({contract.LABEL_GROUP: group} if group else {})}
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return pod_facts(
        {
            "metadata": {"name": name, "namespace": "ns", "labels": labels, "creationTimestamp": CREATED},
            "spec": {"containers": [{"name": "worker"}], **({"nodeName": node} if node else {})},
            "status": {"phase": phase, "conditions": conditions},
        }
    )


def test_a_pass_reads_running_downloads_each_time_and_each_workers_log_once():
    kube = FakeKube(
        {
            "m-fetch": PROGRESS % (2_000_000_000, 30.0),
            "m-decode-0-0": RESULT % (0.0, "cache"),
            "m-decode-0-1": RESULT % (88.0, "download"),
            "m-prefill-0-0": "engine output only",
            "m-prefill-1-0": PROGRESS % (500_000_000, 10.0),
        }
    )
    ctx = FakeCtx(kube)
    pods = [
        _pod("m-fetch", contract.COMPONENT_WEIGHTS_FETCH),
        _pod("m-decode-0-0", "worker", group="m-decode-0"),
        _pod("m-decode-0-1", "worker", group="m-decode-0"),
        _pod("m-prefill-0-0", "worker", group="m-prefill-0"),
        _pod("m-prefill-1-0", "worker", ready=False, group="m-prefill-1"),  # (its launcher may still fetch)
    ]
    spec = deployment().spec
    got = pod_logs.read(ctx, ("ns", "m"), spec, pods, 1000.0)  # type: ignore[arg-type]
    assert got.progress == {"m-fetch": launcher_log.Progress(2_000_000_000, 30.0)}
    assert sorted(kube.reads) == [  # (IN_FLIGHT: each Ready worker's head first; one tail waits a pass)
        ("m-decode-0-0", "worker", None, pod_logs.HEAD_BYTES),
        ("m-decode-0-1", "worker", None, pod_logs.HEAD_BYTES),
        ("m-fetch", "fetch", pod_logs.TAIL_LINES, None),
        ("m-prefill-0-0", "worker", None, pod_logs.HEAD_BYTES),
    ]
    assert got.weights == {"m-decode-0": "download 88 s on 1, cache on 1"}
    # the next pass: the tails (the download and the worker not Ready); no Ready worker again (what each
    # said, or that it said nothing, stays)
    kube.reads.clear()
    again = pod_logs.read(ctx, ("ns", "m"), spec, pods, 1001.0)  # type: ignore[arg-type]
    assert kube.reads == [
        ("m-prefill-1-0", "worker", pod_logs.TAIL_LINES, None),  # (not Ready: its tail, for a download)
        ("m-fetch", "fetch", pod_logs.TAIL_LINES, None),
    ]  # (the longest unread first)
    assert again.weights == {**got.weights, "m-prefill-1": "downloading 0.5 GB, 10 s"}
    kube.reads.clear()
    pod_logs.read(ctx, ("ns", "m"), spec, pods, 1002.0)  # type: ignore[arg-type]
    assert sorted(r[0] for r in kube.reads) == ["m-fetch", "m-prefill-1-0"]
    # a deleted pod leaves the memory
    pod_logs.read(ctx, ("ns", "m"), spec, pods[:2], 1003.0)  # type: ignore[arg-type]
    assert set(ctx.memory.launcher) == {pod_logs._ident(pods[1])}


def test_a_workers_own_download_shows_until_its_launcher_says_where_the_weights_came_from():
    kube = FakeKube({"m-decode-0-0": "starting\n" + PROGRESS % (12_300_000_000, 40.0), "m-decode-0-1": "x"})
    ctx = FakeCtx(kube)
    pods = [
        _pod("m-decode-0-0", "worker", ready=False, group="m-decode-0", node="n1"),
        _pod("m-decode-0-1", "worker", ready=False, phase="Pending", group="m-decode-0", node="n2"),
    ]
    spec = deployment().spec
    got = pod_logs.read(ctx, ("ns", "m"), spec, pods, 1000.0)  # type: ignore[arg-type]
    assert kube.reads == [("m-decode-0-0", "worker", pod_logs.TAIL_LINES, None)]  # (a Pending pod has no log)
    assert got.loading == (("n1", launcher_log.Progress(12_300_000_000, 40.0)),)
    assert got.weights == {"m-decode-0": "downloading 12.3 GB, 40 s"}
    assert got.progress == {}  # (fetch pods' only)
    # the launcher says where the weights came from (before its engine starts): no more reads, even Ready
    kube.logs["m-decode-0-0"] += "\n" + RESULT % (95.0, "download") + "\nengine starting"
    done = pod_logs.read(ctx, ("ns", "m"), spec, pods, 1015.0)  # type: ignore[arg-type]
    assert (done.loading, done.weights) == ((), {"m-decode-0": "download 95 s"})
    kube.reads.clear()
    ready = [replace(pods[0], ready=True), pods[1]]
    assert pod_logs.read(ctx, ("ns", "m"), spec, ready, 1030.0).weights == done.weights  # type: ignore[arg-type]
    assert kube.reads == []
    # a tail that cannot be read is tried again after TAIL_RETRY_SECONDS, not on every pass
    kube.logs["m-decode-0-1"] = ApiError(502, "Bad Gateway", "no kubelet", "GET", "log")
    running = [replace(pods[1], phase="Running")]
    for t in (1000.0, 1001.0, 1000.0 + pod_logs.TAIL_RETRY_SECONDS - 1):
        assert pod_logs.read(ctx, ("ns", "m"), spec, running, t) == pod_logs.LogFacts()  # type: ignore[arg-type]
    assert kube.reads == [("m-decode-0-1", "worker", pod_logs.TAIL_LINES, None)]
    kube.logs["m-decode-0-1"] = PROGRESS % (1_000_000_000, 5.0)
    later = pod_logs.read(ctx, ("ns", "m"), spec, running, 1000.0 + pod_logs.TAIL_RETRY_SECONDS)  # type: ignore[arg-type]
    assert later.loading == (("n2", launcher_log.Progress(1_000_000_000, 5.0)),)
    # its result line scrolled out of the tail (the engine logs on): the download is no longer shown
    kube.logs["m-decode-0-1"] += (
        "\n" + RESULT % (7.0, "download") + "".join(f"\nengine {i}" for i in range(40))
    )
    gone = pod_logs.read(ctx, ("ns", "m"), spec, running, 1100.0)  # type: ignore[arg-type]
    assert (gone.loading, gone.weights) == ((), {})


def test_more_downloads_than_reads_in_flight_take_turns():
    n = pod_logs.IN_FLIGHT + 3
    kube = FakeKube({f"w-{i}": PROGRESS % (i + 1, 1.0) for i in range(n)})
    pods = [_pod(f"w-{i}", "worker", ready=False, group=f"g-{i}", node=f"n{i}") for i in range(n)]
    ctx = FakeCtx(kube)
    spec = deployment().spec
    for t in range(3):
        got = pod_logs.read(ctx, ("ns", "m"), spec, pods, 1000.0 + t)  # type: ignore[arg-type]
    assert len(kube.reads) == 3 * pod_logs.IN_FLIGHT
    assert {r[0] for r in kube.reads} == {p.name for p in pods}  # (none left unread)
    assert len(got.loading) == n


def test_a_log_that_cannot_be_read_is_tried_again_later_and_mounted_weights_read_none():
    kube = FakeKube({"m-decode-0-0": ApiError(403, "Forbidden", "pods/log is forbidden", "GET", "log")})
    ctx = FakeCtx(kube)
    pods = [_pod("m-decode-0-0", "worker", group="m-decode-0")]
    spec = deployment().spec
    assert pod_logs.read(ctx, ("ns", "m"), spec, pods, 1000.0).weights == {}  # type: ignore[arg-type]
    pod_logs.read(ctx, ("ns", "m"), spec, pods, 1000.0 + pod_logs.RETRY_SECONDS - 1)  # type: ignore[arg-type]
    assert len(kube.reads) == 1
    kube.logs["m-decode-0-0"] = RESULT % (0.0, "cache")
    later = pod_logs.read(ctx, ("ns", "m"), spec, pods, 1000.0 + pod_logs.RETRY_SECONDS)  # type: ignore[arg-type]
    assert later.weights == {"m-decode-0": "cache"}
    # weights mounted from a claim: nothing is fetched, no log is read
    mounted = spec.model_copy(deep=True)
    mounted.model.source = "pvc://weights/llama"
    mounted.model.cache.storage_class_name = None
    kube.reads.clear()
    # nor without the operator being told it may (TOKENFAB_READ_POD_LOGS: the chart's rbac.readPodLogs)
    assert pod_logs.read(FakeCtx(kube, read=False), ("ns", "m"), spec, pods, 1.0e9) == pod_logs.LogFacts()  # type: ignore[arg-type]
    assert pod_logs.read(FakeCtx(kube), ("ns", "m"), mounted, pods, 1000.0) == pod_logs.LogFacts()  # type: ignore[arg-type]
    assert kube.reads == []


def test_a_pass_never_waits_for_a_log_and_reads_few_at_a_time():
    kube = FakeKube({f"w-{i}": RESULT % (0.0, "cache") for i in range(10)})
    pods = [_pod(f"w-{i}", "worker", group=f"g-{i}") for i in range(10)]
    ctx = FakeCtx(kube)
    spec = deployment().spec
    first = pod_logs.read(ctx, ("ns", "m"), spec, pods, 1.0)  # type: ignore[arg-type]
    assert len(kube.reads) == pod_logs.IN_FLIGHT
    assert len(first.weights) == pod_logs.IN_FLIGHT
    for t in range(2, 5):
        pod_logs.read(ctx, ("ns", "m"), spec, pods, float(t))  # type: ignore[arg-type]
    assert sorted(r[0] for r in kube.reads) == sorted(p.name for p in pods)  # (each once)
    # reads that do not come back hold the pass up in nothing, and are not asked for twice
    slow = FakeCtx(kube)
    kube.log_pool.hold = True
    assert pod_logs.read(slow, ("ns", "m"), spec, pods, 1.0).weights == {}  # type: ignore[arg-type]
    assert pod_logs.read(slow, ("ns", "m"), spec, pods, 2.0).weights == {}  # type: ignore[arg-type]
    assert len(kube.log_pool.held) == pod_logs.IN_FLIGHT
    for fut, fn, args in kube.log_pool.held:
        fut.set_result(fn(*args))
    later = pod_logs.read(slow, ("ns", "m"), spec, pods, 3.0)  # type: ignore[arg-type]
    assert len(later.weights) == pod_logs.IN_FLIGHT  # (what came back, on the next pass)


def test_status_shows_the_bytes_so_far_and_each_groups_weights():
    md = deployment(decode=1)
    key = weights_cache.weights_key(md.spec)
    running = weights_cache.FetchPod(
        "b-fetch", "n2", "Running", key, progress=launcher_log.Progress(1_500_000_000, 20.0)
    )
    staging = weights_cache.Staging(frozenset({"n2"}), {"n2": ""}, (), ())
    cached = md.model_copy(deep=True)
    cached.spec.model.cache.storage_class_name = "local-nvme"
    got = weights_cache.report(cached.spec, staging, [running])
    assert got is not None
    assert [(d.node, d.bytes, d.seconds) for d in got.downloads] == [("n2", 1_500_000_000, 20.0)]
    assert got.summary == "0 warm, 1 fetching (1.5 GB so far)"
    # a worker's launcher downloading into its node's cache (no fetch pod there) shows the same way
    worker = ("n3", launcher_log.Progress(2_000_000_000, 60.0))
    both = weights_cache.report(cached.spec, staging, [running], loading=[worker])
    assert both is not None
    assert [(d.node, d.bytes) for d in both.downloads] == [("n2", 1_500_000_000), ("n3", 2_000_000_000)]
    assert (both.fetching, both.summary) == (["n2", "n3"], "0 warm, 2 fetching (3.5 GB so far)")
    # two downloads into one node's cache (a worker beside its fetch pod) count its growth once
    same = weights_cache.report(
        cached.spec, staging, [running], loading=[("n2", launcher_log.Progress(9, 5.0))]
    )
    assert same is not None
    assert [(d.node, d.bytes) for d in same.downloads] == [("n2", 1_500_000_000)]
    # each group's words go to status.placement
    snap = snapshot(md, nodes_of({"a": 4}), {}, {})
    groups = materialize(snap, plan(snap))
    again = plan(replace(snap, groups=groups))
    decode = groups["decode"][0].name
    placed = placement(snap.owner, groups, again.roles, frozenset(), {decode: "cache"})
    assert {p.group: p.weights for p in placed} == {
        g.name: ("cache" if g.name == decode else "") for gs in groups.values() for g in gs
    }
    # and a running download asks for a look again soon, to show its bytes
    soon = min(x for x in (again.requeue_after, 15.1) if x is not None)
    assert plan(replace(snap, groups=groups, fetch_pods=(running,))).requeue_after == pytest.approx(soon)
    assert plan(replace(snap, groups=groups, loading=(worker,))).requeue_after == pytest.approx(soon)
    assert again.requeue_after is None or again.requeue_after > 15.1  # (else the looks above prove nothing)


def test_the_launcher_and_the_operator_name_the_same_lines():
    """The marker words the launcher writes are the ones the operator looks for."""
    line = progress.line(
        contract.LOG_WEIGHTS_RESULT, {"source": "cache", "bytes": 3, "files": 1, "seconds": 0.0}
    )
    assert launcher_log.read(f"tokenfab-launcher: {line}").result == Outcome("cache", 3, 1, 0.0)
    line = progress.line(contract.LOG_WEIGHTS_PROGRESS, {"bytes": 7, "seconds": 1.5})
    assert launcher_log.read(f"tokenfab-launcher: {line}").progress == launcher_log.Progress(7, 1.5)


def _initializing(name: str, group: str, node: str, init: dict[str, Any], phase: str = "Pending") -> PodFacts:
    labels = {contract.COMPONENT: "worker", contract.LABEL_GROUP: group}
    return pod_facts(
        {
            "metadata": {"name": name, "namespace": "ns", "labels": labels, "creationTimestamp": CREATED},
            "spec": {
                "initContainers": [{"name": contract.WEIGHTS_INIT_CONTAINER}],
                "containers": [{"name": "worker"}],
                "nodeName": node,
            },
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": "False"}],
                "initContainerStatuses": [{"name": contract.WEIGHTS_INIT_CONTAINER, "state": init}],
            },
        }
    )


def test_a_pods_weights_init_container_is_read_while_it_downloads_and_once_when_it_is_done():
    """The download runs in the weights init container (the pod bound and Pending): its tail shows the
    bytes so far; once it is done its head says where the weights came from, read once, even before the
    worker is Ready (the worker's own log would say `cache`: its init container filled the cache)."""
    kube = FakeKube({"m-decode-0-0": PROGRESS % (3_000_000_000, 12.0)})
    ctx = FakeCtx(kube)
    spec = deployment().spec
    pod = _initializing("m-decode-0-0", "m-decode-0", "n1", {"running": {}})
    assert "downloading the weights (init container weights)" in pod.waiting
    got = pod_logs.read(ctx, ("ns", "m"), spec, [pod], 1000.0)  # type: ignore[arg-type]
    assert kube.reads == [("m-decode-0-0", contract.WEIGHTS_INIT_CONTAINER, pod_logs.TAIL_LINES, None)]
    assert got.loading == (("n1", launcher_log.Progress(3_000_000_000, 12.0)),)
    assert got.weights == {"m-decode-0": "downloading 3.0 GB, 12 s"}
    # done: the worker runs (not Ready yet); the init container's head, once
    kube.logs["m-decode-0-0"] += "\n" + RESULT % (61.0, "download")
    done = _initializing("m-decode-0-0", "m-decode-0", "n1", {"terminated": {"exitCode": 0}}, "Running")
    kube.reads.clear()
    said = pod_logs.read(ctx, ("ns", "m"), spec, [done], 1010.0)  # type: ignore[arg-type]
    assert kube.reads == [("m-decode-0-0", contract.WEIGHTS_INIT_CONTAINER, None, pod_logs.HEAD_BYTES)]
    assert (said.loading, said.weights) == ((), {"m-decode-0": "download 61 s"})
    kube.reads.clear()
    assert pod_logs.read(ctx, ("ns", "m"), spec, [done], 1020.0).weights == said.weights  # type: ignore[arg-type]
    assert kube.reads == []
    # an init container waiting for its image is not read (it has no log yet), and says why it waits
    pulling = _initializing("m-decode-1-0", "m-decode-1", "n2", {"waiting": {"reason": "ImagePullBackOff"}})
    assert pulling.waiting == "init container weights: ImagePullBackOff"
    pod_logs.read(ctx, ("ns", "m"), spec, [pulling], 1030.0)  # type: ignore[arg-type]
    assert kube.reads == []
