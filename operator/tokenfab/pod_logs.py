"""The launcher's lines read from pods' logs (I/O; tokenfab.planning.launcher_log parses them).

- A running weights-fetch pod: the last lines of its log, again on each pass, for its download's bytes so
  far.
- A worker pod whose weights init container runs (or, a pod made without one, whose worker runs and is not
  Ready) and has not said where its weights came from: the same, for its launcher's own download (a cold
  start without a pre-staged cache); once it says, that is kept as below.
- A worker pod whose weights init container is done (or, without one, a Ready worker pod): the head of that
  container's log, once, for where its launcher got the weights. What it said is kept in the deployment's
  memory per pod; a pod whose log could not be read (a node without a log endpoint, no `pods/log`
  permission) is tried again after RETRY_SECONDS.

Only with TOKENFAB_READ_POD_LOGS=1 (the chart's rbac.readPodLogs, which grants `pods/log` get). A pass
never waits for a log: it hands the reads to the client's own small pool (Kube.log_pool, apart from
the writers) and uses what the reads done so far said. At most IN_FLIGHT reads per deployment at a time;
a settled deployment reads none; a deployment whose weights are mounted from a claim reads none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.fleet.facts import PodFacts
from tokenfab.fleet.view import Key
from tokenfab.planning import builders, contract, launcher_log
from tokenfab.runtime import Context, Memory

log = logging.getLogger(__name__)

IN_FLIGHT = 4
TAIL_LINES = 20
HEAD_BYTES = 256 * 1024  # (the launcher's lines come first: a progress line every 10 s, ~75 bytes)
RETRY_SECONDS = 300.0
TAIL_RETRY_SECONDS = 30.0  # (a not-Ready worker's tail that could not be read: its container may be starting)


@dataclass(frozen=True)
class LogFacts:
    progress: Mapping[str, launcher_log.Progress] = field(default_factory=dict)  # fetch pod -> bytes so far
    weights: Mapping[str, str] = field(default_factory=dict)  # group -> how its pods got their weights
    # (node, bytes so far) of each worker whose launcher is downloading
    loading: tuple[tuple[str, launcher_log.Progress], ...] = ()


def _ident(p: PodFacts) -> str:
    return f"{p.name}@{p.created}"  # (a pod made again under its name is another pod)


def _collect(mem: Memory, now: float) -> None:
    """What the finished reads said, into the deployment's memory."""
    for tag, fut in list(mem.log_reads.items()):
        if not fut.done():
            continue
        del mem.log_reads[tag]
        kind, ident = tag
        try:
            got = launcher_log.read(fut.result())
        except Exception as exc:  # (an ApiError: no log endpoint, no permission, no answer in time)
            log.debug("log of pod %s not read: %s", ident, exc)
            if kind != "fetch":
                mem.launcher[ident] = (None, now + (TAIL_RETRY_SECONDS if kind == "tail" else RETRY_SECONDS))
            continue
        if kind in ("fetch", "tail"):
            if got.progress is not None:
                mem.progress[ident] = got.progress
            else:  # (no progress line in its last lines: no download runs now)
                mem.progress.pop(ident, None)
        if kind == "tail" and got.result is not None:
            mem.launcher[ident] = (got.result, float("inf"))  # (said before Ready: no head read then)
        elif kind == "worker":
            mem.launcher[ident] = (got.result, float("inf"))  # (read: what it said, or nothing, stays)


def _due(mem: Memory, ident: str, now: float) -> bool:
    """Whether a worker's log is to be read: it has not said where its weights came from, and a read
    that failed is not waiting for its retry."""
    m = mem.launcher.get(ident)
    return m is None or (m[0] is None and m[1] <= now)


def _fetcher(p: PodFacts) -> str:
    """The container whose launcher downloads a worker pod's weights: its weights init container, or (a
    pod made before it had one) the worker's own launcher."""
    return contract.WEIGHTS_INIT_CONTAINER if p.init else "worker"


def _downloading(p: PodFacts) -> bool:
    """A worker pod whose launcher may be downloading: its weights init container runs (the pod is bound
    and Pending), or, without one, its worker runs and is not Ready yet."""
    if p.deleting:
        return False
    if p.init:
        return p.init == "running" and p.node is not None
    return p.phase == "Running" and not p.ready


def _downloaded(p: PodFacts) -> bool:
    """A worker pod whose launcher has said where its weights came from: its weights init container is
    done, or, without one, its worker is Ready (the line comes before the engine starts)."""
    return p.init == "done" if p.init else p.ready


def read(ctx: Context, key: Key, spec: ModelDeploymentSpec, pods: list[PodFacts], now: float) -> LogFacts:
    if not ctx.settings.read_pod_logs or not builders.fetches_weights(spec):
        return LogFacts()
    mem = ctx.mem(key)
    _collect(mem, now)
    fetching = {
        p.name: p
        for p in pods
        if p.labels.get(contract.COMPONENT) == contract.COMPONENT_WEIGHTS_FETCH
        and p.phase == "Running"
        and not p.deleting
    }
    workers = [
        p for p in pods if p.labels.get(contract.COMPONENT) == "worker" and contract.LABEL_GROUP in p.labels
    ]
    loading = {_ident(p): p for p in workers if _downloading(p) and _due(mem, _ident(p), now)}
    # Each Ready worker's head once, first; then the tails read on every pass, the longest unread first
    # (more downloads than IN_FLIGHT take turns).
    todo: list[tuple[tuple[str, str], PodFacts]] = [
        (("worker", _ident(p)), p) for p in workers if _downloaded(p) and _due(mem, _ident(p), now)
    ]
    tails = [(("fetch", n), p) for n, p in fetching.items()] + [(("tail", i), p) for i, p in loading.items()]
    todo += sorted(tails, key=lambda x: mem.tail_read_at.get(x[0][1], 0.0))
    for tag, p in [x for x in todo if x[0] not in mem.log_reads][: max(0, IN_FLIGHT - len(mem.log_reads))]:
        if tag[0] != "worker":
            mem.tail_read_at[tag[1]] = now
        container = "fetch" if tag[0] == "fetch" else _fetcher(p)
        tail, head = (None, HEAD_BYTES) if tag[0] == "worker" else (TAIL_LINES, None)
        mem.log_reads[tag] = ctx.kube.log_pool.submit(ctx.kube.pod_log, key[0], p.name, container, tail, head)
    _collect(mem, now)  # (those already done)
    alive = {_ident(p) for p in workers}
    mem.launcher = {k: v for k, v in mem.launcher.items() if k in alive}
    loading = {k: p for k, p in loading.items() if _due(mem, k, now)}  # (a tail just read said it)
    mem.progress = {k: v for k, v in mem.progress.items() if k in fetching or k in loading}
    mem.tail_read_at = {k: v for k, v in mem.tail_read_at.items() if k in fetching or k in loading}
    groups: dict[str, list[launcher_log.Outcome | None]] = {}
    for p in workers:
        groups.setdefault(p.labels[contract.LABEL_GROUP], []).append(
            (mem.launcher.get(_ident(p)) or (None, 0.0))[0]
        )
    weights = {g: w for g, rs in groups.items() if (w := launcher_log.group_words(rs))}
    busy: dict[str, list[launcher_log.Progress]] = {}
    for ident, p in loading.items():
        if (got := mem.progress.get(ident)) is not None:
            busy.setdefault(p.labels[contract.LABEL_GROUP], []).append(got)
    weights.update({g: launcher_log.downloading_words(ps) for g, ps in busy.items()})
    downloads = tuple(
        (p.pinned or p.node or "", got) for ident, p in loading.items() if (got := mem.progress.get(ident))
    )
    return LogFacts({k: v for k, v in mem.progress.items() if k in fetching}, weights, downloads)
