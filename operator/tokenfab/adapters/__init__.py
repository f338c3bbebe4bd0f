"""Adapters: the only code that talks to the outside (the Kubernetes API, Prometheus, aiconfigurator).

- `kube`: the Kubernetes API client and the only writer (server-side apply, deletes, the status
  subresource, Events, lists and watches), every request timed out and counted; `kube_rest`: the REST
  paths of the kinds tokenfab touches and the translation of refused requests into `ApiError` (pure);
- `informer`: list-then-watch of one kind, each event handed to a callback (the fleet's cluster view);
- `metrics`: the autoscaler's Prometheus reads; `telemetry`: the operator's own Prometheus metrics;
- `aic`: NVIDIA aiconfigurator, the performance model behind `tokenfab plan` and spec.profile.

Who may import them: the layers above (see the import-linter contracts in pyproject.toml): the runtime,
execute and observe, the reconciler, the inventory, the controller and leader election, the handlers,
the doctor and the CLI. Not tokenfab.fleet (the cluster view is fed by the informers' callbacks and does no
I/O), not tokenfab.planning or tokenfab.api (pure: the adapters import them, not the other way round), and
not the worker launcher (it runs in the worker image, without a cluster client).
"""
