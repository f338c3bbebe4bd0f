"""A live local fleet: real NVIDIA Dynamo processes (mocker engines and the frontend with its KV router)
played for the pods the operator creates on the factory's simulated nodes, real load from aiperf, and the
closed autoscaling loop measured end to end (`python -m e2e.fleet.scenario`, e2e/test_fleet.py,
e2e/bench/fleet_bench.py)."""
