"""Pure planning code: placement, builders, autoscaling policy and status. No I/O, no clocks, no clients."""
