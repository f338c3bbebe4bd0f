"""The fleet controller's shared state: the watch-fed cluster view, the placement ledger and the work queue.

Nothing here talks to the API server: the adapters' watches feed the view, the reconciler reads it and
asks the ledger for capacity, and the work queue decides which deployment is reconciled next.
"""
