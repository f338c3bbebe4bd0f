#!/usr/bin/env bash
# Builds the local AI factory's binaries from the pinned Go wrapper modules beside this script:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok and helm.
#
# Binaries are cached outside the repository in $TOKENFAB_CACHE/bin/<component>-<version>/ and rebuilt
# only when missing or when a pinned version (versions.env) changes. A cold build takes roughly
# 20-40 minutes on 2 cores and several GB of Go module and build cache; a warm run takes a second.
#
# Usage: e2e/toolchain/build.sh [--print-bin-dir]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${TOKENFAB_CACHE:-$HOME/.cache/tokenfab}"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf '[toolchain] %s\n' "$*" >&2; }

k8s_ldflags() {
  local flags="-s -w" p minor
  minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    flags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  printf '%s' "$flags"
}

# build <dir-name> <version> <module dir> <binary> <package> [ldflags]
build() {
  local name="$1" version="$2" moddir="$3" bin="$4" pkg="$5" ldflags="${6:--s -w}"
  local out="$cache/bin/$name-$version"
  if [ -x "$out/$bin" ]; then return 0; fi
  mkdir -p "$out"
  log "building $bin $version (cached afterwards in $out) ..."
  local t0=$SECONDS
  (cd "$here/$moddir" && go build -trimpath -ldflags "$ldflags" -o "$out/$bin.tmp" "$pkg")
  mv "$out/$bin.tmp" "$out/$bin"
  # Kept for the factory benchmark (e2e/bench/factory_bench.py): the cold build time of this binary.
  printf '{"binary": "%s", "version": "%s", "seconds": %d, "built_at": "%s", "cores": %d}\n' \
    "$bin" "$version" "$((SECONDS - t0))" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(nproc)" > "$out/$bin.build.json"
  log "built $bin in $((SECONDS - t0)) s"
}

main() {
  if ! command -v go >/dev/null 2>&1; then
    log "Go is required (1.26+): install it from your distribution or go.dev"; exit 1
  fi
  local t0=$SECONDS
  local kl; kl="$(k8s_ldflags)"
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    build kubernetes "$KUBERNETES_VERSION" kubernetes "$c" "k8s.io/kubernetes/cmd/$c" "$kl"
  done
  build etcd "$ETCD_VERSION" etcd etcd go.etcd.io/etcd/server/v3
  build kwok "$KWOK_VERSION" kwok kwok sigs.k8s.io/kwok/cmd/kwok
  build helm "$HELM_VERSION" helm helm helm.sh/helm/v3/cmd/helm \
    "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  # One directory of links so callers need a single PATH entry.
  local links="$cache/bin/current"
  mkdir -p "$links"
  ln -sf "$cache/bin/kubernetes-$KUBERNETES_VERSION/"* "$links/"
  ln -sf "$cache/bin/etcd-$ETCD_VERSION/etcd" "$links/etcd"
  ln -sf "$cache/bin/kwok-$KWOK_VERSION/kwok" "$links/kwok"
  ln -sf "$cache/bin/helm-$HELM_VERSION/helm" "$links/helm"
  # The kwok stage definitions ship in its module; copy them next to the binary.
  local stages="$cache/bin/kwok-$KWOK_VERSION/stage"
  if [ ! -d "$stages" ]; then
    local kdir; kdir="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
    cp -r "$kdir/kustomize/stage" "$stages"; chmod -R u+w "$stages"
  fi
  ln -sfn "$stages" "$links/kwok-stage"
  if [ $((SECONDS - t0)) -gt 2 ]; then log "toolchain ready in $((SECONDS - t0)) s: $links"; fi
  if [ "${1:-}" = "--print-bin-dir" ]; then printf '%s\n' "$links"; fi
}

main "$@"
