"""Plots for the live fleet: the closed loop's time series and the benchmark's policy comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _save(fig: Any, out: Path, dpi: int = 110) -> Path:
    """Lay the figure out, write it to `out` (making its directory) and close it."""
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def _shade_burst(ax: Any, cfg: dict[str, Any]) -> None:
    a = cfg["before_s"]
    ax.axvspan(a, a + cfg["burst_s"], color="tab:red", alpha=0.06, lw=0)


def closed_loop(result: dict[str, Any], out: Path) -> Path:
    s, w, cfg = result["series"], result["windows"], result["config"]
    t = [r["t"] for r in s]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    ax = axes[0]
    ax.plot(
        [p["time_s"] for p in result["trace"]], [p["qps"] for p in result["trace"]], "k-", label="offered"
    )
    ax.plot([x["t"] for x in w], [x["issued_per_s"] for x in w], "o", ms=3, color="tab:gray", label="issued")
    ax.set_ylabel("requests/s")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"tokenfab closed loop on a live Dynamo fleet ({result['policy']})")
    ax = axes[1]
    ax.plot(t, [r["kv_decode_mean"] for r in s], label="decode mean")
    ax.plot(t, [r["kv_decode_max"] for r in s], ":", label="decode max group")
    ax.axhline(cfg["target"], color="tab:red", ls="--", lw=1, label=f"target {cfg['target']}")
    ax.set_ylabel("KV-cache utilization")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[2]
    for role in ("decode", "prefill"):
        ax.step(t, [r["groups"].get(role) for r in s], where="post", label=f"{role} groups (desired)")
        ax.step(t, [r["ready"].get(role) for r in s], ":", where="post", label=f"{role} ready")
    ax.set_ylabel("groups")
    ax.legend(loc="upper right", fontsize=8)
    ax = axes[3]
    ax.plot([x["t"] for x in w], [x["ttft_p50_ms"] for x in w], "o-", ms=3, label="TTFT p50 (aiperf)")
    ax.plot([x["t"] for x in w], [x["ttft_p99_ms"] for x in w], "s-", ms=3, label="TTFT p99 (aiperf)")
    ax.axhline(result["slo"]["slo"]["ttft_ms"], color="tab:red", ls="--", lw=1, label="TTFT SLO")
    ax.set_yscale("log")
    ax.set_ylabel("ms, by request start")
    ax.set_xlabel("seconds since the trace started")
    ax.legend(loc="upper right", fontsize=8)
    for ax in axes:
        _shade_burst(ax, cfg)
        ax.grid(alpha=0.3)
    return _save(fig, out)


def comparison(results: dict[str, dict[str, Any]], out: Path) -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    any_cfg = next(iter(results.values()))["config"]
    for name, r in results.items():
        s = r["series"]
        axes[0][0].step([x["t"] for x in s], [x["gpus"] for x in s], where="post", label=name)
        axes[0][1].plot([x["t"] for x in s], [x["kv_decode_mean"] for x in s], label=name)
        w = r["windows"]
        axes[1][0].plot([x["t"] for x in w], [x["ttft_p99_ms"] for x in w], "o-", ms=3, label=name)
    axes[0][0].set_ylabel("GPUs held")
    axes[0][1].set_ylabel("decode KV utilization (mean)")
    axes[1][0].set_ylabel("TTFT p99 (ms, per 10 s)")
    axes[1][0].set_yscale("log")
    for ax in (axes[0][0], axes[0][1], axes[1][0]):
        _shade_burst(ax, any_cfg)
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[1][1]
    names = list(results)
    gm = [results[n]["gpu_minutes"] for n in names]
    gp = [100 * (results[n]["slo"]["goodput_fraction"] or 0) for n in names]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], gm, 0.4, label="GPU-minutes")
    ax2 = ax.twinx()
    ax2.bar([i + 0.2 for i in x], gp, 0.4, color="tab:green", label="SLO goodput %")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("GPU-minutes")
    ax2.set_ylabel("SLO goodput (%)")
    ax2.set_ylim(0, 105)
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    fig.suptitle("Same burst trace on a live Dynamo fleet: autoscaling policies")
    return _save(fig, out)


def traces(doc: dict[str, Any], out: Path) -> Path:
    """The fleet benchmark: per trace, GPUs held over time by each policy (plain and cold start), and
    goodput against GPU-minutes (relative to static peak) for every policy."""
    variants = [("plain", doc["traces"])]
    if doc.get("cold_start"):
        variants.append(
            (f"cold start {doc['cold_start']['start_delay_s']:.0f} s", doc["cold_start"]["traces"])
        )
    names = list(doc["traces"])
    fig, axes = plt.subplots(
        len(names), len(variants) + 1, figsize=(5 * (len(variants) + 1), 3.3 * len(names))
    )
    if len(names) == 1:
        axes = [axes]
    markers = {"plain": "o", "cold": "s"}
    for i, trace in enumerate(names):
        for j, (label, by) in enumerate(variants):
            ax = axes[i][j]
            policies = by.get(trace) or {}
            for name, r in policies.items():
                s = r.get("series") or []
                ax.step([x["t"] for x in s], [x["gpus"] for x in s], where="post", label=name, lw=1.2)
            some = next(iter(policies.values()), None)
            if some and some.get("trace"):
                ax2 = ax.twinx()
                ax2.plot([p["time_s"] for p in some["trace"]], [p["qps"] for p in some["trace"]], "k:", lw=1)
                ax2.set_ylabel("offered requests/s", fontsize=8)
            ax.set_title(f"{trace} ({label})", fontsize=9)
            ax.set_ylabel("GPUs held")
            ax.set_xlabel("seconds")
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=7, loc="upper left")
        ax = axes[i][len(variants)]
        for label, by in variants:
            for name, r in (by.get(trace) or {}).items():
                gp = r["slo"]["goodput_fraction"]
                if gp is None or r.get("gpu_minutes_vs_static") is None:
                    continue
                m = markers["cold" if label.startswith("cold") else "plain"]
                ax.scatter(r["gpu_minutes_vs_static"], 100 * gp, marker=m, s=30)
                ax.annotate(
                    f"{name}{'*' if m == 's' else ''}", (r["gpu_minutes_vs_static"], 100 * gp), fontsize=7
                )
        ax.axvline(0.8, color="tab:red", ls="--", lw=1)  # the plain goal: <= 0.8x static's GPU-minutes
        ax.set_xlabel("GPU-minutes / static peak")
        ax.set_ylabel("SLO goodput (%)")
        ax.set_title(f"{trace}: goodput vs cost (* cold start)", fontsize=9)
        ax.grid(alpha=0.3)
    fig.suptitle("Autoscalers and the bounding oracle on live Dynamo fleets (same aiperf traces)")
    return _save(fig, out, dpi=100)


def drain(doc: dict[str, Any], out: Path) -> Path:
    """Every intended request per scenario and contestant: completed, failed, never sent."""
    scenarios = list(doc["scenarios"])
    contestants = [
        c
        for c in ("baseline", "baseline_long_grace", "tokenfab")
        if any(c in by for by in doc["scenarios"].values())
    ]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    width = 0.8 / max(1, len(contestants))
    colors = {"baseline": "tab:gray", "baseline_long_grace": "tab:blue", "tokenfab": "tab:green"}
    for i, policy in enumerate(contestants):
        xs = [j + (i - (len(contestants) - 1) / 2) * width for j in range(len(scenarios))]
        reqs = [(doc["scenarios"][s].get(policy) or {}).get("requests") or {} for s in scenarios]
        completed = [q.get("completed", 0) for q in reqs]
        failed = [q.get("failed", 0) for q in reqs]
        never = [q.get("never_sent", 0) for q in reqs]
        ax.bar(xs, completed, width, color=colors[policy], label=f"{policy}: completed")
        ax.bar(
            xs,
            failed,
            width,
            bottom=completed,
            color="tab:red",
            alpha=0.4 + 0.25 * i,
            label=f"{policy}: failed",
        )
        bottoms = [c + f for c, f in zip(completed, failed, strict=True)]
        ax.bar(
            xs,
            never,
            width,
            bottom=bottoms,
            color="white",
            edgecolor="black",
            hatch="//",
            label=f"{policy}: never sent" if i == 0 else None,
        )
        for x, b, f in zip(xs, bottoms, failed, strict=True):
            ax.text(x, b, str(f), ha="center", va="bottom", fontsize=8)
    tops = [
        q.get("intended", 0)
        for by in doc["scenarios"].values()
        for r in by.values()
        for q in [r.get("requests") or {}]
    ]
    ax.set_ylim(0, max(tops, default=1) * 1.2)
    ax.set_xticks(range(len(scenarios)), scenarios)
    ax.set_ylabel("requests")
    ax.set_title("Groups removed under load: every intended request (failed above each bar)")
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, out)
