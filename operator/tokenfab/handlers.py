"""Thin kopf glue: kopf watches the ModelDeployments and hands every event to the fleet controller, which
does the rest (its own watches, the work queue, the workers). No change handlers, timers or daemons: kopf
keeps no finalizer and no copy of the spec on the objects, so deleting a ModelDeployment never waits for
the operator and its children go by their owner references."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf

from tokenfab.adapters import aic
from tokenfab.adapters.kube import Kube
from tokenfab.api.models import GROUP, PLURAL, VERSION
from tokenfab.controller import Controller, Options
from tokenfab.leader import Elector
from tokenfab.planning.faults import FaultKeys
from tokenfab.runtime import Settings

# A graceful stop waits this long at most for the passes and writes in flight (the pod's grace period is
# longer) before it hands the Lease back.
GRACEFUL_STOP_SECONDS = 10.0

log = logging.getLogger("tokenfab")


def options_from_env() -> Options:
    env = os.environ
    return Options(
        namespaces=[n for n in env.get("TOKENFAB_NAMESPACES", "").split(",") if n],
        workers=int(env.get("TOKENFAB_WORKERS", "4")),
        resync_seconds=float(env.get("TOKENFAB_RESYNC_SECONDS", "60")),
        inventory_seconds=float(env.get("TOKENFAB_INVENTORY_SECONDS", "10")),
        burst_watch_seconds=float(env.get("TOKENFAB_BURST_WATCH_SECONDS", "2")),
        settings=Settings(
            gang=env.get("TOKENFAB_GANG", "auto"),
            bind_timeout=float(env.get("TOKENFAB_BIND_TIMEOUT_SECONDS", "90")),
            fault_reaction=env.get("TOKENFAB_FAULT_REACTION", "replace"),
            gang_delete_seconds=float(env.get("TOKENFAB_GANG_DELETE_SECONDS", "30")),
            fault_keys=FaultKeys.from_env(env),
            read_pod_logs=env.get("TOKENFAB_READ_POD_LOGS", "") in ("1", "true"),
            rdma_resource=env.get("TOKENFAB_RDMA_RESOURCE", "") or Settings.rdma_resource,
        ),
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.enabled = False  # tokenfab posts its own Events, on condition changes only
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60  # kopf's own requests never hang a replica
    settings.networking.connect_timeout = 10
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 64  # watches hold connections; writes go out in parallel
    api = client.ApiClient(cfg)
    kube = Kube(api)
    planner = aic.BackgroundPlanner()  # spec.profile plans, in a process of their own
    controller = Controller(kube, options_from_env(), planner=planner.poll)
    memo["planner"] = planner
    memo["controller"] = controller
    elect = os.environ.get("TOKENFAB_LEADER_ELECT", "false").lower() in ("1", "true", "yes")
    controller.start(leading=not elect)
    if elect:
        # The Lease on a client of its own: its renewals never share a connection pool with the writer's
        # burst of writes.
        memo["elector"] = Elector(
            client.ApiClient(cfg), on_started=controller.lead, on_stopped=_stop_writing(controller)
        ).start()


def _stop_writing(controller: Controller) -> Any:
    def stopped() -> None:
        # Another replica may lead by now: stop at once (no pass may start, none in flight may go on),
        # and let the pod restart as a follower with a fresh view.
        controller.leading.clear()
        log.error("lost the leader Lease: exiting so that only the leader writes")
        logging.shutdown()
        os._exit(75)

    return stopped


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    controller = memo.get("controller")
    if controller is not None:
        # No pass starts from now on; the passes and writes in flight finish (bounded) before the Lease
        # is handed back, so the next leader never plans while this replica still writes.
        controller.leading.clear()
        await asyncio.get_running_loop().run_in_executor(None, controller.stop, GRACEFUL_STOP_SECONDS)
    elector = memo.get("elector")
    if elector is not None:
        elector.release()
    planner = memo.get("planner")
    if planner is not None:
        planner.shutdown()


@kopf.on.event(GROUP, VERSION, PLURAL, id="model-deployments")
async def on_model_deployment(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        controller.on_model_deployment(str(event.get("type") or "MODIFIED"), dict(event["object"]))


@kopf.on.probe(id="controller", backoff=1.0)  # a failed probe is asked again after 1 s, not 60
def health(memo: Any, **_: Any) -> dict[str, Any]:
    """kopf's liveness endpoint answers 500 while this raises: the watches have not listed yet, or a
    reconcile worker is stuck."""
    controller: Controller | None = memo.get("controller")
    if controller is None:
        raise RuntimeError("the controller has not started")
    return controller.health()
