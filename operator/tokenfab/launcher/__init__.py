"""The worker launcher: what every tokenfab worker pod runs (`python3 -m tokenfab.launcher <dynamo args>`).

The reconciler (tokenfab.planning.builders.group_pods) gives each pod of a group its identity in the
environment (role, group, rank, world size, GPUs per pod, leader address, workers Service, namespace, the
engine YAML path: names from tokenfab.planning.contract) and the Dynamo worker's arguments as the
container's args, computed by `builders.worker_args`. The launcher passes those arguments on unchanged:
`worker_args` stays the single source of the Dynamo arguments, `kubectl get pod -o yaml` shows exactly
what runs, and a new Dynamo flag needs no new environment variable. The launcher only decides HOW to run
them, from the group identity:

- a single-pod group (world size 1): `python3 -m dynamo.trtllm <args>` (TensorRT-LLM spreads over the
  pod's GPUs itself);
- rank 0 of a multi-node group (the leader): waits until every other rank's SSH daemon answers, then
  `mpirun ... trtllm-llmapi-launch python3 -m dynamo.trtllm <args>` with one MPI process per GPU of the
  group; TensorRT-LLM's `trtllm-llmapi-launch` runs the Dynamo worker on MPI rank 0 and makes every other
  MPI process an LLM-API worker of the same engine (as NVIDIA Dynamo's operator does);
- the other ranks (followers): an SSH daemon on `contract.MPI_SSH_PORT` that mpirun reaches with the key
  pair of the `contract.MPI_SSH_SECRET` Secret; their /health and /metrics are answered by the launcher on
  the worker metrics port (rank 0's Dynamo worker serves its own there: DYN_SYSTEM_PORT).

Two parts:
- the pure part (unit tested, no I/O: the import contract on `tokenfab.launcher.plan` covers everything it
  imports): environment + engine YAML + arguments -> a `LaunchPlan` (files to prepare, commands to run,
  peers to wait for, the health endpoint), or a `ConfigError` whose messages name the variable or engine key
  at fault and the fix.
  `tokenfab.launcher.identity` reads and checks the group identity from the environment,
  `tokenfab.launcher.engine_shape` checks the engine YAML against the group,
  `tokenfab.launcher.weights` decides where hf:// weights come from, and `tokenfab.launcher.plan` turns
  them into commands (mpirun, sshd) and re-exports every public name of the other three (code outside the
  launcher imports them from there);
- `tokenfab.launcher.run` (thin process part): reads the engine file, prepares the run directory, fetches
  hf:// weights (`tokenfab.launcher.fetch`), waits for peers, starts the command in its own process group,
  forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to that group, reaps orphans (it is PID 1 of the
  container), serves /health and /metrics on followers and exits with the command's exit code (128 + N
  when a signal N ended it). `python -m tokenfab.launcher` runs its `main`.

Who may import it: nothing of the operator (the launcher is a top layer, beside tokenfab.cli); the e2e
fleet runner and tests import the plan to run worker pods as a kubelet would. The launcher itself imports
only tokenfab.planning and tokenfab.api (the names it shares with the reconciler), never a cluster client,
the adapters, the reconciler or the handlers: it runs in the worker image.

Exit codes: the command's own; 78 (EX_CONFIG) for a bad configuration, with every problem printed;
1 when preparing or waiting for peers failed; 127 when a program is missing from the image.
`--dry-run` validates and prints the plan as JSON without running anything.
`--fetch-only` (alone) stages the hf:// weights in the model cache and exits: what a weights-fetch pod
runs (tokenfab.planning.weights_cache decides where).
"""
