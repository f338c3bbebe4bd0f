"""tokenfab: a Kubernetes operator for LLM inference fleets on NVL72 racks (TensorRT-LLM, NVIDIA Dynamo)."""

__version__ = "0.1.0"
