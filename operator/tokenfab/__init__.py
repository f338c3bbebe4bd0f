"""tokenfab: a Kubernetes operator for LLM inference fleets on NVL72 racks (TensorRT-LLM, NVIDIA Dynamo).

What lives where, top layer first (import-linter's contracts in pyproject.toml enforce that a module
imports only the layers below it):

- cli, launcher: the `tokenfab` command, and the worker pods' launcher (which imports no cluster client);
- doctor, handlers: the cluster check, and kopf's thin handlers (they hand keys to the controller);
- controller, leader: the fleet controller (watches, work queue, the one writer's threads) and election;
- inventory: the NVLink domains' status objects;
- reconcile: one pass of a ModelDeployment (`Pass`), observe -> plan -> act -> settle;
- observe, act, settle: the phases (the snapshot read; the plan's writes and their answers; the status
  and Events);
- routing, views, pod_logs: the act phase's second round (gates, routing); the cluster view's facts as
  planning's types; the launcher's lines read from pod logs;
- runtime: the process's settings, context, a pass's Result and what a pass observed;
- fleet: the state the passes share (cluster view, placement ledger, expectations, work queue);
- adapters: the Kubernetes and Prometheus clients, telemetry, aiconfigurator;
- planning: every decision, pure (no I/O), `planning.one_pass.plan(snapshot) -> Plan`;
- api: the CRD's models and rules; it imports nothing else from tokenfab.

docs/architecture.md draws one pass and the fleet controller.
"""

__version__ = "0.1.0"
