#!/usr/bin/env bash
# Installs what the quick start and the test suite need, on a fresh machine or a warm one:
#   - Debian packages: prometheus (and its promtool), openssl, lua5.4 (apt-get, once);
#   - the Python virtualenv .venv with tokenfab and its dev tools (pip, re-run when pyproject changes);
#   - the local AI factory's binaries, built from Go modules and cached in ~/.cache/tokenfab
#     (the first build takes about 10-12 minutes on 2 cores; later runs take a second).
# Source it: it exports TOKENFAB_BIN (the binaries) and puts .venv/bin and TOKENFAB_BIN on PATH.
set -euo pipefail

TOKENFAB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export TOKENFAB_ROOT
say() { printf '[tokenfab] %s\n' "$*" >&2; }

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v lua5.4 >/dev/null 2>&1 || need_apt+=(lua5.4)  # runs the chart's Argo CD health check in tests
if [ ${#need_apt[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_apt[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

venv="$TOKENFAB_ROOT/.venv"
stamp="$venv/.tokenfab-installed"
if [ ! -x "$venv/bin/python" ]; then
  say "creating the Python virtualenv $venv"
  python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ "$TOKENFAB_ROOT/pyproject.toml" -nt "$stamp" ]; then
  say "installing tokenfab and its dev tools into $venv (about a minute)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$TOKENFAB_ROOT[dev,plan]"  # plan: aiconfigurator, for `tokenfab plan`
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"

TOKENFAB_BIN="$("$TOKENFAB_ROOT/e2e/toolchain/build.sh" --print-bin-dir)"
export TOKENFAB_BIN
export PATH="$TOKENFAB_BIN:$PATH"

# The live fleet's tools: NVIDIA Dynamo and aiperf in their own virtualenvs in ~/.cache/tokenfab/venvs
# (a few minutes the first time; a no-op when cached).
bash "$TOKENFAB_ROOT/e2e/fleet/setup.sh"
