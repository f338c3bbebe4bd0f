#!/usr/bin/env bash
# Every benchmark the README quotes, one after another on this machine (about 3.5 hours on 2 cores; run
# nothing else meanwhile: they share the cores with what they measure). Each writes its result file and
# its history copy under e2e/bench/results/ (e2e/record.py) and starts and stops its own factory.
# Usage: bash e2e/bench/all.sh [name ...]   (names: autoscaler operator factory scale rack_loss burst drain faults
# closed_loop fleet fleet_cold fabric fabric_live)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/bootstrap.sh
source "$here/../lib/bootstrap.sh"
cd "$TOKENFAB_ROOT"
bash e2e/fleet/setup.sh

run() {
  say "benchmark: $*"
  local t0=$SECONDS
  python -m "$@"
  say "done in $((SECONDS - t0)) s: $*"
}

wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(autoscaler operator factory scale rack_loss burst drain faults closed_loop fleet fleet_cold fabric fabric_live)
for name in "${wanted[@]}"; do
  work="$(mktemp -d -t tokenfab-bench-XXXXXX)"
  case "$name" in
    autoscaler) run e2e.bench.autoscaler_bench ;;
    operator) run e2e.bench.operator_bench ;;
    factory) run e2e.bench.factory_bench ;;
    scale) run e2e.bench.scale_bench --run-dir "$work/run" ;;
    rack_loss) run e2e.bench.rack_loss_bench --baseline-ref 380a8ac --run-dir "$work/run" ;;
    burst) run e2e.bench.burst_bench --run-dir "$work/run" ;;
    drain) run e2e.bench.drain_bench --run-dir "$work/run" ;;
    faults) run e2e.bench.fault_bench ;;
    closed_loop) run e2e.fleet.scenario --run-dir "$work/run" --port-base 31100 ;;
    fleet)
      run e2e.bench.fleet_bench --run-dir "$work/run" --port-base 31200
      ;;
    fleet_cold) run e2e.bench.fleet_bench_cold --run-dir "$work/run" --port-base 31300 ;;
    fabric) run e2e.bench.fabric_bench ;;
    fabric_live) run e2e.bench.fabric_live_bench --run-dir "$work/run" --port-base 31400 ;;
    *) echo "unknown benchmark: $name" >&2; exit 2 ;;
  esac
  rm -rf "$work"
done
