"""Load from NVIDIA aiperf (its own virtualenv) against a fleet's frontend, and what it measured.

A load trace is a piecewise-linear request rate (aiperf's --request-rate-series); `steady`, `ramp` and
`burst` build the three profiles. One aiperf process runs the whole trace (its start-up costs ~15-30 s on
2 cores, so phases are not separate runs); it is started in its own session and stopped by PID. Its
per-request records (profile_export.jsonl) give the offered load, TTFT and ITL over time and the SLO
goodput.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenfab_factory import process


@dataclass(frozen=True)
class Point:
    time_s: float
    qps: float


def steady(qps: float, seconds: float) -> list[Point]:
    return [Point(0, qps), Point(seconds, qps)]


def ramp(qps_from: float, qps_to: float, seconds: float) -> list[Point]:
    return [Point(0, qps_from), Point(seconds, qps_to)]


def burst(quiet_qps: float, burst_qps: float, before_s: float, burst_s: float, after_s: float) -> list[Point]:
    """Quiet -> burst -> quiet, with one-second edges."""
    return [
        Point(0, quiet_qps),
        Point(before_s, quiet_qps),
        Point(before_s + 1, burst_qps),
        Point(before_s + burst_s, burst_qps),
        Point(before_s + burst_s + 1, quiet_qps),
        Point(before_s + burst_s + after_s, quiet_qps),
    ]


def repeated_burst(
    quiet_qps: float,
    burst_qps: float,
    first_s: float,
    width_s: float,
    period_s: float,
    count: int,
    total_s: float,
) -> list[Point]:
    """`count` bursts of `width_s` seconds, one every `period_s` seconds from `first_s`, quiet elsewhere, for
    `total_s` seconds in all (one-second edges)."""
    out = [Point(0, quiet_qps)]
    for i in range(count):
        a = first_s + i * period_s
        out += [Point(a, quiet_qps), Point(a + 1, burst_qps), Point(a + width_s, burst_qps)]
        out.append(Point(a + width_s + 1, quiet_qps))
    out.append(Point(total_s, quiet_qps))
    return out


def ramp_up_down(
    quiet_qps: float,
    peak_qps: float,
    start_s: float,
    up_s: float,
    hold_s: float,
    down_s: float,
    total_s: float,
) -> list[Point]:
    """Quiet, a linear ramp up to the peak, a hold, a linear ramp back down, quiet to `total_s`."""
    a, b, c = start_s + up_s, start_s + up_s + hold_s, start_s + up_s + hold_s + down_s
    return [
        Point(0, quiet_qps),
        Point(start_s, quiet_qps),
        Point(a, peak_qps),
        Point(b, peak_qps),
        Point(c, quiet_qps),
        Point(total_s, quiet_qps),
    ]


def rises(points: list[Point]) -> list[float]:
    """When the load starts to rise above its quiet level: each burst's or ramp's start."""
    out: list[float] = []
    for a, b in itertools.pairwise(points):
        if b.qps > a.qps and (not out or a.time_s > out[-1] + 1.5):
            out.append(a.time_s)
    return out


def rate_at(points: list[Point], t: float) -> float:
    """The trace's request rate at t seconds (piecewise linear; 0 outside)."""
    if not points or t < points[0].time_s or t > points[-1].time_s:
        return 0.0
    for a, b in itertools.pairwise(points):
        if a.time_s <= t <= b.time_s:
            span = b.time_s - a.time_s
            return a.qps if span <= 0 else a.qps + (b.qps - a.qps) * (t - a.time_s) / span
    return points[-1].qps


def duration(points: list[Point]) -> float:
    return points[-1].time_s if points else 0.0


def intended(points: list[Point]) -> int:
    """The requests a trace asks for: the integral of its piecewise-linear rate, rounded."""
    return round(sum((b.time_s - a.time_s) * (a.qps + b.qps) / 2 for a, b in itertools.pairwise(points)))


def account(records: list[Request], intended_n: int, sent: int | None, osl: int) -> dict[str, int]:
    """Every request a run meant to send, counted once: intended = completed + failed + never_sent.

    - sent: what reached the server (its own counter of requests started; at least what was recorded);
    - completed: recorded with every token asked for and no error;
    - failed: sent and not completed: an error, a stream cut short, or one still pending when the client
      stopped waiting (sent but never recorded);
    - never_sent: intended but not sent (held back by the client's concurrency limit, or the run ended)."""
    recorded = len(records)
    sent_n = max(recorded, sent if sent is not None else recorded)
    intended_n = max(intended_n, sent_n)  # (the integral rounds; a client may round up)
    completed = sum(1 for r in records if r.complete(osl))
    return {
        "intended": intended_n,
        "sent": sent_n,
        "completed": completed,
        "failed": sent_n - completed,
        "never_sent": intended_n - sent_n,
        "recorded": recorded,
    }


def reconcile(
    records: list[Request], intended_n: int, frontend: dict[str, int] | None, osl: int
) -> dict[str, Any]:
    """The requests of a run as two observers count them, and whether they agree; no count is derived
    from the other observer's or clamped to it.

    - client (the load generator's records): `recorded` (every request it issued and wrote down) and
      `completed` (no error, every token asked for);
    - frontend (Dynamo's own counters over the run, `frontend`: started, success, error):
      `sent` (requests it accepted), `success`, `error`.

    They agree when recorded == started and the client's answers without an error == success. (A stream
    that ended without an error but with fewer tokens than asked is a success to the frontend and not
    completed to the client: counted as failed, `short`, and no disagreement.) Returned with the counts as
    `account` gives them (from the frontend's `sent`) and `problems`, a line per disagreement (none:
    [])."""
    recorded = len(records)
    completed = sum(1 for r in records if r.complete(osl))
    answered = sum(1 for r in records if not r.error)
    problems: list[str] = []
    if frontend is None:
        problems.append("the frontend's counters could not be read")
        sent = recorded
    else:
        sent = frontend["started"]
        if recorded != sent:
            problems.append(f"the client recorded {recorded} requests, the frontend started {sent}")
        if answered != frontend["success"]:
            problems.append(
                f"the client got {answered} answers without an error, the frontend counted "
                f"{frontend['success']} successes"
            )
    if sent > intended_n + 1:  # (the integral rounds: one more is the client rounding up)
        problems.append(f"{sent} requests were sent, more than the {intended_n} the trace intended")
    intended_n = max(intended_n, sent)
    return {
        "intended": intended_n,
        "sent": sent,
        "completed": completed,
        "failed": sent - completed,
        "never_sent": intended_n - sent,
        "recorded": recorded,
        "short": answered - completed,
        "frontend": dict(frontend) if frontend is not None else None,
        "problems": problems,
    }


@dataclass
class Slo:
    ttft_ms: float = 2000.0
    itl_ms: float = 150.0


@dataclass
class Request:
    start: float  # unix seconds the request was issued
    ttft_ms: float | None
    itl_ms: float | None
    latency_ms: float | None
    output_tokens: int
    error: str = ""

    def complete(self, osl: int) -> bool:
        """No error and every token asked for."""
        return not self.error and self.output_tokens >= osl

    def good(self, slo: Slo, osl: int) -> bool:
        """Complete, within the TTFT and ITL targets."""
        return (
            self.complete(osl)
            and self.ttft_ms is not None
            and self.ttft_ms <= slo.ttft_ms
            and (self.itl_ms is None or self.itl_ms <= slo.itl_ms)
        )


@dataclass
class AiperfRun:
    """One aiperf process playing a trace; start() returns at once, wait() collects its records."""

    aiperf: str
    url: str
    model: str
    tokenizer_dir: Path
    points: list[Point]
    artifact_dir: Path
    isl: int = 160
    osl: int = 64
    concurrency: int = 48
    grace_s: float = 30.0
    dataset_entries: int = 48
    slo: Slo = field(default_factory=Slo)
    pid: int | None = None
    started_at: float = 0.0

    def argv(self) -> list[str]:
        series = self.artifact_dir / "rate-series.json"
        series.write_text(json.dumps([{"time_s": p.time_s, "qps": p.qps} for p in self.points]))
        return [
            self.aiperf,
            "profile",
            "--model",
            self.model,
            "--url",
            self.url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--tokenizer",
            str(self.tokenizer_dir),
            "--isl",
            str(self.isl),
            "--isl-stddev",
            "0",
            "--osl",
            str(self.osl),
            "--osl-stddev",
            "0",
            "--extra-inputs",
            f"min_tokens:{self.osl}",
            "--extra-inputs",
            "ignore_eos:true",
            "--request-rate-series",
            str(series),
            "--arrival-pattern",
            "constant",
            "--concurrency",
            str(self.concurrency),
            "--benchmark-duration",
            str(duration(self.points)),
            "--benchmark-grace-period",
            str(self.grace_s),
            # a small synthetic dataset, cycled: generating prompts costs aiperf ~0.1-0.2 s each here
            "--num-dataset-entries",
            str(self.dataset_entries),
            "--random-seed",
            "7",
            "--goodput",
            f"time_to_first_token:{self.slo.ttft_ms} inter_token_latency:{self.slo.itl_ms}",
            "--ui-type",
            "none",
            "--no-server-metrics",
            "--no-gpu-telemetry",
            "--artifact-dir",
            str(self.artifact_dir),
            "--zmq-ipc-path",
            str(self.ipc_dir()),
            "--workers-max",
            "2",
            "--record-processors",
            "1",
        ]

    def ipc_dir(self) -> Path:
        """aiperf's sockets: a short path of its own (a UNIX socket path is limited to 107 characters, which
        a deep artifact directory exceeds), removed by stop()."""
        if getattr(self, "_ipc", None) is None:
            self._ipc = Path(tempfile.mkdtemp(prefix="tf-aiperf-"))
        return self._ipc

    def env(self) -> dict[str, str]:
        """aiperf's environment: ours, less the hub's offline switches (it loads a local tokenizer directory
        only with them unset, ../shared/REFERENCE.md §6, and never needs the network for one), and its
        memory-mapped dataset files in its own directory (else /tmp/aiperf_mmap_*, left behind)."""
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        env["AIPERF_DATASET_MMAP_BASE_PATH"] = str(self.ipc_dir())
        return env

    def start(self) -> int:
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        log = (self.artifact_dir / "aiperf.log").open("ab")
        proc = subprocess.Popen(
            self.argv(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=self.env(),
            cwd=self.artifact_dir,
        )
        log.close()
        self.pid = proc.pid
        self._proc = proc
        self.started_at = time.time()
        return proc.pid

    def wait(self, timeout: float) -> int:
        try:
            return int(self._proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop aiperf by PID (SIGTERM then SIGKILL), and any of its own children by their PIDs; remove its
        directory of sockets and dataset files."""
        if self.pid is not None:
            children = _children(self.pid)
            process.stop(self.pid, timeout=15)
            for pid in children:
                process.stop(pid, timeout=5)
        if getattr(self, "_proc", None) is not None:
            self._proc.poll()
        if getattr(self, "_ipc", None) is not None:
            shutil.rmtree(self._ipc, ignore_errors=True)

    def records(self) -> list[Request]:
        return read_records(self.artifact_dir / "profile_export.jsonl")

    def summary(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.artifact_dir / "profile_export_aiperf.json").read_text()))
        except (OSError, ValueError):
            return {}


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(p.name))
    return out


def _value(metrics: dict[str, Any], name: str) -> float | None:
    v = metrics.get(name, {}).get("value")
    return float(v) if isinstance(v, int | float) else None


def read_records(path: Path) -> list[Request]:
    out: list[Request] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        md, m = d.get("metadata", {}), d.get("metrics", {})
        start_ns = md.get("request_start_ns") or md.get("credit_issued_ns")
        if not start_ns:
            continue
        err = d.get("error")
        out.append(
            Request(
                start=start_ns / 1e9,
                ttft_ms=_value(m, "time_to_first_token"),
                itl_ms=_value(m, "inter_token_latency"),
                latency_ms=_value(m, "request_latency"),
                output_tokens=int(_value(m, "output_sequence_length") or 0),
                error=json.dumps(err)[:200] if err else ("cancelled" if md.get("was_cancelled") else ""),
            )
        )
    return sorted(out, key=lambda r: r.start)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def windows(records: list[Request], t0: float, width: float, end: float) -> list[dict[str, Any]]:
    """Per window of `width` seconds from t0: issued requests/s, TTFT p50/p99 (ms), errors."""
    out = []
    n = max(1, math.ceil((end - t0) / width))
    for i in range(n):
        a, b = t0 + i * width, t0 + (i + 1) * width
        rs = [r for r in records if a <= r.start < b]
        ttft = [r.ttft_ms for r in rs if r.ttft_ms is not None and not r.error]
        out.append(
            {
                "t": round(a - t0 + width / 2, 2),
                "issued_per_s": round(len(rs) / width, 3),
                "ttft_p50_ms": percentile(ttft, 0.5),
                "ttft_p99_ms": percentile(ttft, 0.99),
                "errors": sum(1 for r in rs if r.error),
            }
        )
    return out


def goodput(records: list[Request], slo: Slo, requests: dict[str, int], osl: int) -> dict[str, Any]:
    """SLO goodput: the fraction of the requests the trace intended (`account`) that were sent, completed
    and within the TTFT and ITL targets; a request never sent or left pending counts as a miss."""
    n = requests["intended"]
    good = sum(1 for r in records if r.good(slo, osl))
    ttft = [r.ttft_ms for r in records if r.ttft_ms is not None and not r.error]
    itl = [r.itl_ms for r in records if r.itl_ms is not None and not r.error]
    return {
        "requests": n,
        "good": good,
        "errors": sum(1 for r in records if r.error),
        # what the failed requests were told, most frequent first (kept: a run's directory is not)
        "error_texts": [
            {"text": text, "count": count}
            for text, count in Counter(r.error[:200] for r in records if r.error).most_common(5)
        ],
        "goodput_fraction": round(good / n, 4) if n else None,
        "ttft_p50_ms": percentile(ttft, 0.5),
        "ttft_p99_ms": percentile(ttft, 0.99),
        "itl_p50_ms": percentile(itl, 0.5),
        "itl_p99_ms": percentile(itl, 0.99),
        "slo": {"ttft_ms": slo.ttft_ms, "itl_ms": slo.itl_ms},
    }
