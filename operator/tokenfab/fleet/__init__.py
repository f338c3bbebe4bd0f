"""The fleet controller's shared state: the watch-fed cluster view, the placement ledger and the work queue.

- `facts`: what the operator reads of a pod, a node or a shared child, reduced to frozen records (pure);
- `view`: the cluster view, those facts indexed by deployment and node, fed by the informers' events,
  answering which deployments an event concerns and how much of each node is used;
- `ledger`: the placement ledger, the one authority over NVLink-domain capacity (room promised to pods
  the watches have not shown yet);
- `expectations`: a deployment's writes the watches have not shown yet (its next pass waits for them);
- `workqueue`: which deployment is reconciled next.

Nothing here talks to the API server (an import-linter contract forbids the cluster clients, sockets and
subprocesses): the adapters' watches feed the view, the reconciler reads it and asks the ledger for
capacity, and the work queue decides which deployment is reconciled next. Who may import it: the layers
above it (the runtime, execute and observe, the reconciler, the inventory, the controller, the CLI); it
imports only tokenfab.planning and tokenfab.api.
"""
