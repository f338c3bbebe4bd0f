"""The fleet runner's processes on this host: `Proc`, the one Dynamo process standing in for a pod (what the
runner's state file lists), `PortPool`, the loopback ports it hands them, `spawn`, which starts one so that it
dies with the runner, and `foreign_connections`, the loopback guard that reads a process's sockets."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tokenfab_factory import process


@dataclass
class Proc:
    """One Dynamo process standing in for one pod."""

    key: str  # <namespace>/<pod>
    uid: str
    kind: str  # mocker | frontend
    pid: int
    ports: dict[str, int]
    labels: dict[str, str]
    started_at: float
    url: str = ""
    metrics_url: str = ""
    health_url: str = ""  # what the pod's readiness probe asks
    argv: list[str] = field(default_factory=list)
    grace: float = 30.0  # the pod's terminationGracePeriodSeconds
    prestop: float = 0.0  # the pod's preStop sleep
    terminating_since: float | None = None
    sigterm_at: float | None = None  # when SIGTERM is due (after preStop)
    sigterm_sent: bool = False
    out_of_routing: bool = False  # its pod's routable gate is False (the EndpointSlice says not ready)
    target: dict[str, str] = field(default_factory=dict)  # its Prometheus target's discovery labels
    node: str = ""  # the node its pod is bound to (when that Node is gone, the process dies at once)
    failing_since: float | None = None  # its health endpoint has not answered since (once it had)


class PortPool:
    def __init__(self, lo: int, hi: int) -> None:
        self.free = list(range(lo, hi + 1))
        self.used: set[int] = set()

    def take(self) -> int:
        for i, p in enumerate(self.free):
            if process.port_free(p):
                del self.free[i]
                self.used.add(p)
                return p
        raise RuntimeError("no free port left in the fleet's range")

    def give(self, port: int) -> None:
        if port in self.used:
            self.used.discard(port)
            self.free.append(port)  # reuse last: a port leaves TIME_WAIT before it comes round again


def foreign_connections(pid: int) -> list[str]:
    """The remote addresses outside loopback that a process (or any of its children) is connected to, TCP
    or UDP: the fleet may only ever talk to 127.0.0.1 (EndpointSlices carry the pods' simulated IPs)."""
    out = []
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    for p in family:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:
            continue
        for conn in conns:
            if conn.raddr and not ipaddress.ip_address(conn.raddr.ip).is_loopback:
                out.append(f"{conn.raddr.ip}:{conn.raddr.port}")
    return sorted(set(out))


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the runner dies without stopping us (e.g. SIGKILL)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(argv: Sequence[str], log: Path, env: dict[str, str]) -> int:
    """Start a Dynamo process in its own session, output appended to `log`; it dies with the runner."""
    return process.start(argv, log, env, preexec=_die_with_parent)
