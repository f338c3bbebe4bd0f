"""The launcher's lines read from pods' logs for a pass (I/O; tokenfab.planning.launcher_log parses them).

- A running weights-fetch pod: the last lines of its log, every pass, for its download's bytes so far.
- A Ready worker pod: the head of its log, once, for where its launcher got the weights (the line comes
  before the engine starts). What it said is kept in the deployment's memory by pod; a pod whose log could
  not be read (no kubelet log endpoint, no `pods/log` permission) is tried again after RETRY_SECONDS.

At most READS_PER_PASS logs per pass, read at once on the client's pool, each with a short timeout: a
settled deployment reads none. A deployment whose weights are mounted from a claim reads none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

from tokenfab.api.models import ModelDeploymentSpec
from tokenfab.fleet.facts import PodFacts
from tokenfab.fleet.view import Key
from tokenfab.planning import builders as b
from tokenfab.planning import contract as c
from tokenfab.planning import launcher_log
from tokenfab.runtime import Context

log = logging.getLogger(__name__)

READS_PER_PASS = 8
TAIL_LINES = 20
HEAD_BYTES = 64 * 1024
RETRY_SECONDS = 300.0
WAIT_SECONDS = 6.0  # for all of one pass's reads


@dataclass(frozen=True)
class LogFacts:
    progress: Mapping[str, launcher_log.Progress] = field(default_factory=dict)  # fetch pod -> bytes so far
    weights: Mapping[str, str] = field(default_factory=dict)  # group -> how its pods got their weights


def _ident(p: PodFacts) -> str:
    return f"{p.name}@{p.created}"  # (a pod made again under its name is another pod)


def read(ctx: Context, key: Key, spec: ModelDeploymentSpec, pods: list[PodFacts], now: float) -> LogFacts:
    if not b.fetches_weights(spec):
        return LogFacts()
    memo = ctx.mem(key).launcher
    fetching = [
        p
        for p in pods
        if p.labels.get(c.COMPONENT) == c.COMPONENT_WEIGHTS_FETCH and p.phase == "Running" and not p.deleting
    ]
    workers = [p for p in pods if p.labels.get(c.COMPONENT) == "worker" and c.LABEL_GROUP in p.labels]
    due = [
        p
        for p in workers
        if p.ready and ((m := memo.get(_ident(p))) is None or (m[0] is None and m[1] <= now))
    ]
    jobs: list[tuple[PodFacts, bool, Future[str]]] = []
    for p in fetching[:READS_PER_PASS]:
        jobs.append((p, True, ctx.kube.pool.submit(ctx.kube.pod_log, key[0], p.name, "fetch", TAIL_LINES)))
    for p in due[: READS_PER_PASS - len(jobs)]:
        read_head = ctx.kube.pod_log
        jobs.append((p, False, ctx.kube.pool.submit(read_head, key[0], p.name, "worker", None, HEAD_BYTES)))
    progress: dict[str, launcher_log.Progress] = {}
    for p, is_fetch, fut in jobs:
        try:
            text = fut.result(timeout=WAIT_SECONDS)
        except Exception as exc:  # (an ApiError, or no answer in time)
            log.debug("log of pod %s/%s not read: %s", key[0], p.name, exc)
            if not is_fetch:
                memo[_ident(p)] = (None, now + RETRY_SECONDS)
            continue
        got = launcher_log.read(text)
        if is_fetch and got.progress is not None:
            progress[p.name] = got.progress
        elif not is_fetch:
            memo[_ident(p)] = (got.result, float("inf"))  # (read: what it said stays; nothing said stays too)
    alive = {_ident(p) for p in workers}
    for gone in [k for k in memo if k not in alive]:
        del memo[gone]
    groups: dict[str, list[launcher_log.Outcome | None]] = {}
    for p in workers:
        groups.setdefault(p.labels[c.LABEL_GROUP], []).append((memo.get(_ident(p)) or (None, 0.0))[0])
    weights = {g: w for g, rs in groups.items() if (w := launcher_log.group_words(rs))}
    return LogFacts(progress, weights)
