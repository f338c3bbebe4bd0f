"""The local AI factory: real Kubernetes control plane, simulated NVL72 racks (kwok) and Prometheus."""
