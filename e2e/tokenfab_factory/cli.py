"""`tokenfab factory up|down|status`: the user-facing commands of the local AI factory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tokenfab_factory import process
from tokenfab_factory.config import FactoryConfig, FactoryError, default_run_dir
from tokenfab_factory.factory import Factory
from tokenfab_factory.racks import SYSTEMS

app = typer.Typer(no_args_is_help=True, add_completion=False)

RunDir = Annotated[
    Path | None,
    typer.Option(
        "--run-dir", help="Run directory (state, logs, kubeconfig, env) [default: ~/.cache/tokenfab/factory]."
    ),
]
PortBase = Annotated[int, typer.Option(help="First of 8 consecutive loopback ports the factory uses.")]


def _factory(run_dir: Path | None, port_base: int = 31000, racks: int = 4, gpu: str = "gb200") -> Factory:
    return Factory(
        FactoryConfig(run_dir=run_dir or default_run_dir(), racks=racks, gpu=gpu, port_base=port_base),
        say=lambda s: typer.echo(s, err=True),
    )


def _existing(run_dir: Path | None) -> Factory:
    """The factory in the run directory, with the ports, racks and GPU system it was started with (not
    the defaults: a factory started with --port-base answers there)."""
    f = _factory(run_dir)
    state = f.read_state()
    return f if state is None else _factory(run_dir, state.port_base, state.racks, state.gpu)


@app.command()
def up(
    racks: Annotated[int, typer.Option(min=1, max=128, help="NVL72 racks (18 nodes x 4 GPUs each).")] = 4,
    gpu: Annotated[str, typer.Option(help="GPU system: " + ", ".join(SYSTEMS))] = "gb200",
    run_dir: RunDir = None,
    port_base: PortBase = 31000,
) -> None:
    """Start etcd, kube-apiserver, controller-manager, scheduler, kwok with N racks, and Prometheus."""
    if gpu not in SYSTEMS:
        raise typer.BadParameter(f"unknown GPU system {gpu!r}; choose one of {', '.join(SYSTEMS)}")
    f = _factory(run_dir, port_base, racks, gpu)
    typer.echo(
        f"starting the local AI factory: {racks} {gpu} NVL72 racks ({racks * 18} nodes, "
        f"{racks * 72} GPUs) in {f.run}",
        err=True,
    )
    try:
        state = f.up()
    except FactoryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if state.ready_seconds is not None:
        typer.echo(f"ready in {state.ready_seconds} s", err=True)
    _print_status(f)
    typer.echo(f"\nUse it:  source {f.env_file}  &&  kubectl get nodes -L nvidia.com/gpu.clique")


@app.command()
def down(
    run_dir: RunDir = None,
    purge: Annotated[bool, typer.Option(help="Also delete the run directory and its logs.")] = False,
) -> None:
    """Stop every factory process by its PID; logs stay in the run directory unless --purge."""
    f = _existing(run_dir)
    try:
        stopped = f.down(purge=purge)
    except FactoryError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"stopped: {', '.join(stopped) or 'nothing was running'}")


@app.command()
def operator(
    run_dir: RunDir = None,
    stop: Annotated[bool, typer.Option(help="Stop the operator instead.")] = False,
    liveness_port: Annotated[
        int | None,
        typer.Option(help="Loopback port of the operator's health endpoint (default: the port base + 80)."),
    ] = None,
) -> None:
    """Run the tokenfab operator against this factory in the background (log: <run-dir>/logs/operator.log)."""
    f = _existing(run_dir)
    if stop:
        typer.echo("operator stopped" if f.stop_extra("operator") else "operator was not running")
        return
    state = f.read_state()
    if state is None:
        typer.echo(f"no factory in {f.run} (start one with `tokenfab factory up`)", err=True)
        raise typer.Exit(1)
    pid = f.start_operator(liveness_port or state.port_base + 80)
    typer.echo(f"operator running, pid {pid}, log {f.log('operator')}")


@app.command()
def status(run_dir: RunDir = None) -> None:
    """Report each component's process and health, and the nodes; exit 1 if anything is unhealthy."""
    f = _existing(run_dir)
    if f.read_state() is None:
        typer.echo(f"no factory in {f.run} (start one with `tokenfab factory up`)")
        raise typer.Exit(1)
    if not _print_status(f):
        raise typer.Exit(1)


def _print_status(f: Factory) -> bool:
    state = f.read_state()
    statuses = f.component_status(state)
    port_of = {"etcd": "etcd", "prometheus": "prometheus"}
    typer.echo(f"{'COMPONENT':<24} {'PID':>8} {'PORT':>6} {'RSS':>8}  HEALTH")
    for s in statuses:
        port = f.config.port(port_of.get(s.name, s.name)) if state else 0
        rss = f"{s.rss_bytes / 2**20:.0f}Mi" if s.rss_bytes else "-"
        health = "ok" if s.healthy else ("DOWN" if not s.running else "UNHEALTHY")
        typer.echo(
            f"{s.name:<24} {s.pid or '-':>8} {port:>6} {rss:>8}  {health}  {'' if s.healthy else s.detail}"
        )
    ok = all(s.healthy for s in statuses)
    if statuses[1].healthy:
        ready, total = f.node_counts()
        typer.echo(f"nodes: {ready}/{total} Ready")
    for name, pid in f.extra_pids().items():
        alive = process.alive(pid)
        typer.echo(f"{name}: pid {pid} {'running' if alive else 'DOWN'} (log {f.log(name)})")
        ok = ok and alive
        ok = ok and ready == total and total > 0
    typer.echo(f"kubeconfig: {f.kubeconfig}\nprometheus: {f.prometheus_url}\nlogs: {f.run / 'logs'}")
    return ok


fault_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Inject hardware faults into the simulated racks, the way a real cluster signals them; heal them.",
)
app.add_typer(fault_app, name="fault")
NodeArg = Annotated[str | None, typer.Argument(help="A node (e.g. gb200-r01-t03; a tray is one node).")]
RackOpt = Annotated[int | None, typer.Option(help="Every node of this rack (0-based: gb200-rRR-*).")]


def _running(run_dir: Path | None) -> Factory:
    f = _existing(run_dir)
    if f.read_state() is None:
        typer.echo(f"no factory in {f.run} (start one with `tokenfab factory up`)", err=True)
        raise typer.Exit(1)
    return f


@fault_app.command()
def lose(node: NodeArg = None, rack: RackOpt = None, run_dir: RunDir = None) -> None:
    """Delete a node, a tray or a whole rack's Nodes at once (kept for `heal`)."""
    from tokenfab_factory import faults

    f = _running(run_dir)
    names = faults.nodes_of(f, node, rack)
    faults.lose(f, names)
    typer.echo(f"lost {len(names)} node(s): {', '.join(names)}")


@fault_app.command()
def quarantine(
    node: Annotated[str, typer.Argument(help="The node whose GPU failed.")],
    taint: Annotated[
        bool, typer.Option(help="Also taint it NoSchedule, as NVSentinel's rulesets can.")
    ] = True,
    drain_after: Annotated[
        float | None, typer.Option(help="Then evict its pods after this many seconds (NVSentinel's drainer).")
    ] = None,
    run_dir: RunDir = None,
) -> None:
    """Quarantine a node as NVIDIA's NVSentinel does: cordon, annotation, SysLogsXIDError condition, taint."""
    from tokenfab_factory import faults

    f = _running(run_dir)
    faults.quarantine(f, node, taint=taint)
    typer.echo(f"quarantined {node}")
    if drain_after is not None:
        import time

        time.sleep(drain_after)
        typer.echo(f"drained {node}: {faults.drain(f, node)}")


@fault_app.command("taint-device")
def taint_device(
    node: Annotated[str, typer.Argument(help="The node whose device is tainted.")],
    device: Annotated[str, typer.Option(help="Device in the node's pool.")] = "channel-0",
    driver: Annotated[
        str, typer.Option(help="The DRA driver that publishes it.")
    ] = "compute-domain.nvidia.com",
    effect: Annotated[str, typer.Option(help="NoSchedule or NoExecute.")] = "NoSchedule",
    run_dir: RunDir = None,
) -> None:
    """Taint one device of a node with a DRA DeviceTaintRule (resource.k8s.io/v1)."""
    from tokenfab_factory import faults

    if effect not in ("NoSchedule", "NoExecute"):
        raise typer.BadParameter("effect must be NoSchedule or NoExecute")
    rule = faults.taint_device(_running(run_dir), node, device, driver, effect)
    typer.echo(f"DeviceTaintRule {rule}: {driver}/{node}/{device} {effect}")


def _namespaced(value: str, what: str) -> tuple[str, str]:
    """NAMESPACE/NAME split, or a usage error naming what was expected."""
    namespace, _, name = value.partition("/")
    if not namespace or not name:
        raise typer.BadParameter(f"give {what}")
    return namespace, name


@fault_app.command("break-domain")
def break_domain(
    domain: Annotated[str, typer.Argument(help="NAMESPACE/NAME of a group's ComputeDomain.")],
    run_dir: RunDir = None,
) -> None:
    """Turn a ComputeDomain NotReady (its IMEX daemons failed), as NVIDIA's DRA driver would report it."""
    from tokenfab_factory import faults

    faults.break_domain(_running(run_dir), *_namespaced(domain, "NAMESPACE/NAME"))
    typer.echo(f"ComputeDomain {domain} NotReady")


@fault_app.command()
def hang(
    pod: Annotated[str, typer.Argument(help="NAMESPACE/POD of a worker.")],
    run_dir: RunDir = None,
) -> None:
    """Make a worker stop answering its health endpoint while its node stays healthy (a hung engine)."""
    from tokenfab_factory import faults

    typer.echo(faults.hang(_running(run_dir), *_namespaced(pod, "NAMESPACE/POD")))


@fault_app.command()
def heal(node: NodeArg = None, run_dir: RunDir = None) -> None:
    """Undo injected faults on a node (default: all): lost Nodes back, quarantines lifted, taints removed."""
    from tokenfab_factory import faults

    done = faults.heal(_running(run_dir), None if node is None else [node])
    typer.echo("\n".join(done) or "nothing to heal")
