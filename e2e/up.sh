#!/usr/bin/env bash
# Quick start: brings up the local AI factory (a real Kubernetes 1.37 control plane, 4 simulated GB200
# NVL72 racks = 72 nodes / 288 GPUs, Prometheus), installs tokenfab's CRDs, starts the operator and
# applies the DeepSeek-R1 example. Installs what it needs first (see e2e/lib/bootstrap.sh): the first run
# builds the control plane from Go modules (about 10-15 minutes on 2 cores); later runs take seconds.
#
#   bash e2e/up.sh [--racks N] [--gpu gb200|gb300]      then: source ~/.cache/tokenfab/factory/env
#   tokenfab factory down                                 stops everything by PID
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/bootstrap.sh
source "$here/lib/bootstrap.sh"
cd "$TOKENFAB_ROOT"

tokenfab factory up "$@"
run_dir="${TOKENFAB_FACTORY_DIR:-$HOME/.cache/tokenfab/factory}"
# shellcheck disable=SC1091
source "$run_dir/env"
say "installing the tokenfab CRDs"
kubectl apply --server-side --force-conflicts --field-manager=tokenfab-quickstart -f crds/ >/dev/null
# (polled: kubectl 1.37's `wait --for=condition=Established` fails at once while the CRD has no conditions)
established() {
  [ "$(kubectl get crd modeldeployments.tokenfab.dev \
      -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ]
}
for _ in $(seq 120); do established && break; sleep 0.5; done
established || { echo "the ModelDeployment CRD was not Established within 60 s" >&2; exit 1; }
say "starting the tokenfab operator"
tokenfab factory operator
say "applying examples/deepseek-r1-disaggregated.yaml"
kubectl apply --server-side --field-manager=tokenfab-quickstart -f examples/deepseek-r1-disaggregated.yaml
cat <<MSG

The local AI factory is up. Try:
  source $run_dir/env
  kubectl get nodes -L nvidia.com/gpu.clique | head
  kubectl get mdep -o wide                 # Ready within seconds: 2 prefill + 2 decode groups
  kubectl get nvlinkdomains                # free GPUs and groups per NVL72 rack
  kubectl explain modeldeployment.spec.decode.parallelism
  tokenfab factory status
Stop it with: tokenfab factory down   (the env file puts kubectl, helm and tokenfab on PATH)
MSG
