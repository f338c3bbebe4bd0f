"""A live local fleet: real NVIDIA Dynamo processes (mocker engines and the frontend with its KV router)
played for the pods the operator creates on the factory's simulated nodes, real load from aiperf, and the
closed autoscaling loop measured end to end. See e2e/fleet/README section in the top-level README."""
