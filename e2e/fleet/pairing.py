"""Which prefill worker and which decode worker served each request, seen by two observers, and so where
each KV transfer went (Dynamo 1.6.1, disaggregated):

- the client: a request that asks `"nvext": {"extra_fields": ["worker_id"]}` gets the pair back in every
  streamed chunk's `nvext.worker_id` ({prefill_worker_id, decode_worker_id, ...}; `send` streams and keeps
  the last one);
- the frontend's own log: one `request completed` line per request (target
  `dynamo_llm::http::service::metrics`, INFO) with `prefill_worker_id=` and `decode_worker_id=`
  (`frontend_pairs`).

A worker's instance id is the one its own log names when it joins Kubernetes discovery
(`Initializing KubeDiscoveryClient: ... target=Pod("<pod>") ... instance_id=<hex>`, `instance_ids`); the
pod then gives its unit and its NVLink domain (labels). `tally` counts the transfers kept inside a unit and
inside a domain, and whether both observers saw the same pairs.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ANSI = re.compile(r"\x1b\[[0-9;]*m")
JOINED = re.compile(r'Initializing KubeDiscoveryClient: .*target=Pod\("([^"]+)"\).*instance_id=([0-9a-f]+)')
DONE = re.compile(
    r"request completed request_id=(\S+) .*prefill_worker_id=\"?(\d+)\"?.* decode_worker_id=\"?(\d+)"
)

Pair = tuple[int, int]  # (prefill worker id, decode worker id)


def instance_ids(logs: Path, namespace: str) -> dict[int, str]:
    """Worker instance id -> its pod's name, from the workers' logs of `namespace` (the runner's files are
    `<namespace>_<pod>.log`)."""
    out: dict[int, str] = {}
    for path in sorted(logs.glob(f"{namespace}_*.log")):
        for line in ANSI.sub("", path.read_text(errors="replace")).splitlines():
            m = JOINED.search(line)
            if m:
                out[int(m.group(2), 16)] = m.group(1)
    return out


def frontend_pairs(text: str) -> dict[str, Pair]:
    """Request id -> (prefill, decode) worker ids, from a frontend's log."""
    out: dict[str, Pair] = {}
    for line in ANSI.sub("", text).splitlines():
        m = DONE.search(line)
        if m:
            out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out


@dataclass
class Sent:
    """What the client did: every request intended, sent, completed or failed, and what came back."""

    intended: int
    sent: int = 0
    completed: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    pairs: dict[str, Pair] = field(default_factory=dict)  # response id (its request id) -> pair
    ttft_s: list[float] = field(default_factory=list)

    @property
    def never_sent(self) -> int:
        return self.intended - self.sent


def _one(url: str, model: str, i: int, max_tokens: int) -> tuple[str, Pair | None, float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"request {i}: say something about NVLink domains"}],
        "max_tokens": max_tokens,
        "stream": True,
        "nvext": {"extra_fields": ["worker_id"]},
    }
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0, ttft, rid, pair = time.monotonic(), -1.0, "", None
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if ttft < 0:
                ttft = time.monotonic() - t0
            rid = str(chunk.get("id") or rid)
            got = ((chunk.get("nvext") or {}).get("worker_id")) or {}
            if "prefill_worker_id" in got and "decode_worker_id" in got:
                pair = (int(got["prefill_worker_id"]), int(got["decode_worker_id"]))
    return rid.removeprefix("chatcmpl-"), pair, ttft


def send(url: str, model: str, requests: int, concurrency: int = 4, max_tokens: int = 8) -> Sent:
    """`requests` streamed chat completions, `concurrency` at a time, each asking for its worker pair."""
    out = Sent(intended=requests)
    lock = threading.Lock()
    todo = iter(range(requests))

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
                if i is None:
                    return
                out.sent += 1
            try:
                rid, pair, ttft = _one(url, model, i, max_tokens)
            except (OSError, ValueError, urllib.error.URLError) as exc:
                with lock:
                    out.failed += 1
                    out.errors[type(exc).__name__] += 1
                continue
            with lock:
                if pair is None:
                    out.failed += 1
                    out.errors["no worker_id in the response"] += 1
                    continue
                out.completed += 1
                out.pairs[rid] = pair
                out.ttft_s.append(ttft)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return out


@dataclass(frozen=True)
class Tally:
    transfers: int  # requests the client saw served, each one KV hand-over from a prefill to a decode worker
    in_unit: int  # its prefill and decode workers in one prefill-decode unit
    in_domain: int  # ... in one NVLink domain
    unknown: int  # a worker id no worker's log named
    frontend: int  # of those, the requests the frontend's log saw completed, by request id
    agree: bool  # the frontend's log saw every one of them, with the same pair
    by_pair: dict[str, int]  # "prefill pod -> decode pod": requests

    def as_dict(self) -> dict[str, Any]:
        return {
            "transfers": self.transfers,
            "in_unit": self.in_unit,
            "in_domain": self.in_domain,
            "in_domain_share": round(self.in_domain / self.transfers, 4) if self.transfers else None,
            "unknown_workers": self.unknown,
            "frontend_saw": self.frontend,
            "observers_agree": self.agree,
            "by_pair": self.by_pair,
        }


def tally(
    client: Mapping[str, Pair],
    frontend: Mapping[str, Pair],
    pods: Mapping[int, str],
    unit_of: Mapping[str, str],
    domain_of: Mapping[str, str],
) -> Tally:
    """Count the client's pairs by where the two workers are (`unit_of`/`domain_of`: pod -> its unit and
    NVLink domain), and check them against the frontend's."""
    in_unit = in_domain = unknown = 0
    by_pair: Counter[str] = Counter()
    for p, d in client.values():
        pp, dp = pods.get(p), pods.get(d)
        if pp is None or dp is None:
            unknown += 1
            continue
        by_pair[f"{pp} -> {dp}"] += 1
        in_unit += unit_of.get(pp) is not None and unit_of.get(pp) == unit_of.get(dp)
        in_domain += domain_of.get(pp) is not None and domain_of.get(pp) == domain_of.get(dp)
    seen = {r: frontend[r] for r in client if r in frontend}
    agree = seen == dict(client)
    return Tally(len(client), in_unit, in_domain, unknown, len(seen), agree, dict(sorted(by_pair.items())))


__all__ = ["Pair", "Sent", "Tally", "frontend_pairs", "instance_ids", "send", "tally"]
