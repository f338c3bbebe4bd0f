"""Benchmark of the local AI factory: cold build time of its binaries, warm start time (up -> every node
Ready) and memory for a small and a large factory, and whether the large one stays healthy.

The 4-rack start is the baseline measured in the same run; nothing here passes or fails on a time.
Run: python -m e2e.bench.factory_bench [--racks 4 64] [--hold 60] [--out DIR]  (prints a table, saves
e2e/bench/results/factory.json by default; the test suite's run saves nothing).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from e2e import record
from e2e.helpers import repeat_for
from tokenfab_factory import process
from tokenfab_factory.config import FactoryConfig, default_bin_dir
from tokenfab_factory.factory import Factory


def build_times(bin_dir: Path) -> list[dict[str, Any]]:
    """Cold build times recorded by e2e/toolchain/build.sh when each binary was built."""
    out = []
    for link in sorted(bin_dir.iterdir()):
        record = link.resolve().parent / f"{link.name}.build.json"
        if record.exists():
            out.append(json.loads(record.read_text()))
    return out


def start_factory(racks: int, port_base: int, hold: float) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"tokenfab-bench-{racks}-"))
    f = Factory(FactoryConfig(run_dir=run_dir, racks=racks, port_base=port_base), say=lambda s: None)
    t0 = time.monotonic()
    try:
        state = f.up(timeout=900)
        up_seconds = time.monotonic() - t0
        rss = {s.name: s.rss_bytes for s in f.component_status(state)}
        samples: list[dict[str, Any]] = []

        def sample() -> None:
            ready, total = f.node_counts()
            alive = all(process.alive(pid) for pid in state.pids.values())
            samples.append(
                {"t": round(time.monotonic() - t0, 1), "ready": ready, "total": total, "alive": alive}
            )

        repeat_for(hold, 5, sample)
        rss_after = {s.name: s.rss_bytes for s in f.component_status(state)}
        healthy = all(s["alive"] and s["ready"] == s["total"] == racks * 18 for s in samples)
        return {
            "racks": racks,
            "nodes": racks * 18,
            "gpus": racks * 72,
            "up_seconds": round(up_seconds, 2),
            "phases": state.phases,
            "rss_mib_at_ready": {k: round(v / 2**20) for k, v in rss.items()},
            "rss_mib_after_hold": {k: round(v / 2**20) for k, v in rss_after.items()},
            "total_rss_mib_after_hold": round(sum(rss_after.values()) / 2**20),
            "hold_seconds": hold,
            "stayed_healthy": healthy,
            "samples": samples,
        }
    finally:
        f.down(purge=True)


def run(racks_list: list[int], hold: float, port_base: int = 30500) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "factory",
        "machine": {"cores": len(__import__("os").sched_getaffinity(0)), "python": platform.python_version()},
        "cold_build": build_times(default_bin_dir()),
        "starts": [start_factory(r, port_base, hold) for r in racks_list],
    }
    base = result["starts"][0]
    for s in result["starts"]:
        s["up_vs_baseline"] = round(s["up_seconds"] / base["up_seconds"], 2) if base["up_seconds"] else None
    return result


def report(result: dict[str, Any]) -> str:
    lines = ["cold build (cached afterwards):"]
    for b in result["cold_build"]:
        lines.append(
            f"  {b['binary']:<24} {b['version']:<9} {b['seconds']:>5} s  ({b['cores']} cores, {b['built_at']})"  # noqa: E501
        )
    lines.append(f"  {'total':<34} {sum(b['seconds'] for b in result['cold_build']):>5} s")
    lines.append(f"{'racks':>6} {'nodes':>6} {'GPUs':>6} {'up s':>7} {'x base':>7} {'RSS MiB':>8}  healthy")
    for s in result["starts"]:
        lines.append(
            f"{s['racks']:>6} {s['nodes']:>6} {s['gpus']:>6} {s['up_seconds']:>7} {s['up_vs_baseline']:>7} "
            f"{s['total_rss_mib_after_hold']:>8}  {s['stayed_healthy']} over {s['hold_seconds']:.0f} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--racks", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--hold", type=float, default=60.0, help="seconds to watch each factory after Ready")
    parser.add_argument("--out", type=Path, default=record.RESULTS)
    args = parser.parse_args(argv)
    started = time.time()
    result = run(args.racks, args.hold)
    print(report(result))
    print(f"saved {record.save('factory', result, args.out, 'e2e.bench.factory_bench', argv, started)}")


if __name__ == "__main__":
    main()
