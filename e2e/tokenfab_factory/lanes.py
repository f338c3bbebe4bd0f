"""Test lanes: the suite runs its modules side by side (pytest-xdist, one worker per lane), and each lane
has ports of its own, so that the factories, operators and fleet runners of two lanes never meet.

Every range lies below the kernel's ephemeral range (32768-60999 by default), where no process binds a
port the lane chose while it starts. 31000-31499 stay free: the quick start's factory (`e2e/up.sh`)
lives there, and a factory a user has up is never touched by the suite.

Inside a lane's 500 ports: the session factory from its base (its operators and runners' liveness from
base + 20), a one-rack factory at + 100, the scale smoke's at + 200, the factory smoke's at + 250, the
quick-start test's at + 300, the rack-loss smoke's at + 350, a bare API server at + 400, the burst smoke's
at + 450.
"""

from __future__ import annotations

import os

LANE_BASES = (32000, 31500, 30500, 30000)
# The fleet runner's two ranges per lane (e2e/fleet/runner.py): the processes' ports, and the workers'
# system ports (Dynamo 1.6.1 reads DYN_SYSTEM_PORT as a signed 16-bit integer: below 32768).
RUNNER_PORTS = ((27100, 27899), (28100, 28899), (29100, 29899), (24100, 24899))
RUNNER_SYSTEM_PORTS = ((26100, 26899), (25100, 25899), (23100, 23899), (22100, 22899))
LANE_SPAN = 500


def lane() -> int:
    """This process's lane: the xdist worker's number (gw0, gw1, ...), 0 outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker.removeprefix("gw") or 0)
    if n >= len(LANE_BASES):
        most = len(LANE_BASES)
        raise RuntimeError(f"{worker}: the suite has {most} lanes of ports; run it with -n {most} or fewer")
    return n


def port_base() -> int:
    """The lane's first port. TOKENFAB_E2E_PORT_BASE moves lane 0 (the others follow it, LANE_SPAN apart,
    downwards); without it the lanes take LANE_BASES."""
    moved = os.environ.get("TOKENFAB_E2E_PORT_BASE")
    return int(moved) - LANE_SPAN * lane() if moved else LANE_BASES[lane()]


def runner_ports() -> tuple[tuple[int, int], tuple[int, int]]:
    """The fleet runner's (ports, system ports) ranges in this lane."""
    return RUNNER_PORTS[lane()], RUNNER_SYSTEM_PORTS[lane()]
