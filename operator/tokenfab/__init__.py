"""tokenfab: a Kubernetes operator for LLM inference fleets on NVL72 racks (TensorRT-LLM, NVIDIA Dynamo).

What lives where, top layer first (import-linter's contracts in pyproject.toml enforce that a module
imports only the layers below it):

- cli, launcher: the `tokenfab` command, and the worker pods' launcher (which imports no cluster client);
- doctor, handlers: the cluster check, and kopf's thin handlers (they hand keys to the controller);
- controller, leader: the fleet controller (watches, work queue, the one writer's threads) and election;
- inventory: the NVLink domains' status objects;
- reconcile: one pass of a ModelDeployment, observe -> plan -> act;
- execute, observe: acting on a plan (the writes), and reading the cluster view into planning's types;
- routing, status_write: routing and gang admission after the writes, and the status and Events;
- runtime: the process's settings, context and a pass's Result;
- fleet: the state the passes share (cluster view, placement ledger, expectations, work queue);
- adapters: the Kubernetes and Prometheus clients, telemetry, aiconfigurator;
- planning: every decision, pure (no I/O), `planning.one_pass.plan(snapshot) -> Plan`;
- api: the CRD's models and rules; it imports nothing else from tokenfab.

docs/architecture.md draws one pass and the fleet controller.
"""

__version__ = "0.1.0"
