"""Adapters: the only code that talks to the outside (the Kubernetes API, Prometheus)."""
