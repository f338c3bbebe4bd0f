#!/usr/bin/env bash
# Installs the live fleet's tools in their own cached virtualenvs, outside the repository:
#   ~/.cache/tokenfab/venvs/dynamo  NVIDIA Dynamo 1.6.1 (mocker engines, frontend + KV router)
#   ~/.cache/tokenfab/venvs/aiperf  NVIDIA aiperf 0.13.0 (load generator)
#   ~/.cache/tokenfab/venvs/checkov checkov (the test suite checks the pods tokenfab builds and the chart)
#   ~/.cache/tokenfab/venvs/s3      boto3 (the worker launcher's s3:// fetch, as in the worker image) and
#                                   moto's S3 server on loopback to fetch from (tests/test_launcher_s3.py);
#                                   apart from the operator's venv: botocore pins python-dateutil<3, the
#                                   kubernetes client >=3
#   ~/.cache/tokenfab/venvs/wheels  the modelexpress wheel, not installed (tests/test_launcher_modelexpress.py)
# Idempotent: a stamp file per venv records the pinned versions; a warm run takes well under a second.
# ai-dynamo is installed with --no-deps (its `aisimulate` dependency is a PyPI placeholder that fails and
# it pins kubernetes<33): its other requirements are listed here by hand (../../shared/REFERENCE.md §4).
set -euo pipefail

say() { printf '[tokenfab fleet] %s\n' "$*" >&2; }
VENVS="${TOKENFAB_VENVS:-$HOME/.cache/tokenfab/venvs}"
PY="${PYTHON:-python3}"
DYNAMO_VERSION=1.6.1
AIPERF_VERSION=0.13.0
CHECKOV_VERSION=3.3.30
BOTO3_VERSION=1.44.8
MOTO_VERSION=5.2.5
MODELEXPRESS_VERSION=0.7.0

dynamo_reqs=(
  "ai-dynamo-runtime==$DYNAMO_VERSION" aiohttp "kubernetes<33" msgspec prometheus-client pyzmq redis
  transformers tokenizers typing-extensions zstandard tqdm certifi
)

install_venv() {  # name stamp-text pip-args...
  local name="$1" want="$2"; shift 2
  local venv="$VENVS/$name" stamp="$VENVS/$name/.tokenfab-installed"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  say "installing $want into $venv (a few minutes the first time)"
  mkdir -p "$VENVS"
  [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$@"
  printf '%s' "$want" >"$stamp"
}

dyn="$VENVS/dynamo/bin/python"
install_venv dynamo "ai-dynamo==$DYNAMO_VERSION ${dynamo_reqs[*]}" \
  bash -c "'$dyn' -m pip install -q ${dynamo_reqs[*]@Q} && '$dyn' -m pip install -q --no-deps ai-dynamo==$DYNAMO_VERSION"

ap="$VENVS/aiperf/bin/python"
install_venv aiperf "aiperf==$AIPERF_VERSION" "$ap" -m pip install -q "aiperf==$AIPERF_VERSION"

ck="$VENVS/checkov/bin/python"
install_venv checkov "checkov==$CHECKOV_VERSION" "$ck" -m pip install -q "checkov==$CHECKOV_VERSION"

s3_reqs=("boto3==$BOTO3_VERSION" "moto[server]==$MOTO_VERSION" pydantic pyyaml)
s3py="$VENVS/s3/bin/python"
install_venv s3 "${s3_reqs[*]}" "$s3py" -m pip install -q "${s3_reqs[@]}"

# modelexpress' wheel alone (it pulls torch): the suite checks the launcher's calls against its source.
mx_wheels=("$VENVS"/wheels/modelexpress-"$MODELEXPRESS_VERSION"-*.whl)
if [ ! -f "${mx_wheels[0]}" ]; then
  say "downloading the modelexpress $MODELEXPRESS_VERSION wheel into $VENVS/wheels"
  "$s3py" -m pip download -q --no-deps --only-binary=:all: -d "$VENVS/wheels" "modelexpress==$MODELEXPRESS_VERSION"
fi

export TOKENFAB_DYNAMO_PYTHON="$dyn"
export TOKENFAB_AIPERF="$VENVS/aiperf/bin/aiperf"
