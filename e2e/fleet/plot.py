"""Plots for the live fleet: the closed loop's time series and the benchmark's policy comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


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
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


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
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
