"""The planning layer: tokenfab's decisions as pure functions, with no I/O.

Everything here takes what was observed as plain values (the spec, the groups and their pods, the nodes and
their free GPUs, metric samples already read, the time as a number) and returns values: placement in
NVLink domains, the children's manifests, the plan of each role's groups, autoscaling decisions, SLA
plans and the status. Nothing here reads a clock, calls the API server or Prometheus, opens a file or a
socket, or logs; the layers above do that and hand the results in.

What may import it: every layer above it (adapters, fleet, runtime, observe, act and settle, reconcile,
the controller, handlers, doctor, the CLI and the worker launcher; see the layers contract in
pyproject.toml).
What it imports: of tokenfab, only tokenfab.api (and its own modules); otherwise the standard library and
pure libraries (PyYAML renders the engine config). The import-linter contracts keep both directions, and
forbid the cluster and HTTP clients here.

Main modules: one_pass (one pass's whole plan from its snapshot: `one_pass.plan(snapshot) -> Plan`, and
the status once its writes are answered), writes (every write a plan names), room (free capacity as one
plan sees it), autoscaler (the package: `queries` and `step`; its policy, forecast, signals and memory),
topology and capacity (NVLink domains, the placement ledger), lifecycle and recovery (a group's state,
backoff), groups (what to create, release, drain and delete per role), builders (the children's
manifests, by concern), engine and contract (the engine config, the names shared with the worker
images), sla (plans from a performance model), status (conditions and the status subresource).

Importing the package has no side effects: it imports none of its modules.
"""
