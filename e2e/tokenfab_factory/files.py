"""The files a factory writes into its run directory: the admin kubeconfig, kwok's stages (how simulated
nodes and pods behave, and which pods the live fleet runs), Prometheus' configuration (tokenfab's
documented scrape job over the fleet runner's targets) and the env file a shell sources."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from tokenfab_factory.config import FactoryError, Layout

KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-delete.yaml",
)
# Pods in namespaces named live-* are run by the fleet runner (e2e/fleet/runner.py), which plays their
# kubelet's probes: kwok starts them (Running; a container with a startup probe not `started` yet) but leaves
# them not ready, and the runner sets `started` and ContainersReady when the engine's /health answers and
# Ready when the readiness gates hold too, as a kubelet does. Everywhere else kwok's fast stage makes a pod
# Ready (and its readiness gates True) at once.
# Both give the pod an IP from POD_CIDR, as a kubelet would: the EndpointSlice controller lists a pod only
# with one (Dynamo's kubernetes discovery never connects to it: its addresses come from DynamoWorkerMetadata).
LIVE_NAMESPACE_PREFIX = "live-"
LIVE_POD_START = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: tokenfab-live-pod-start
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.spec.nodeName'
      operator: 'Exists'
    - key: '.metadata.namespace | startswith("live-")'
      operator: 'In'
      values: ['true']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: PodScheduled
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: ContainersReady
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: ContainersNotReady
        type: Ready
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: {{ if .startupProbe }}false{{ else }}true{{ end }}
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
         ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
"""
# A weights-fetch pod (tokenfab's pre-staging) outside the live namespaces completes two seconds after it
# runs, as its download would (the live namespaces' runner times it by the weights model instead).
FETCH_POD_COMPLETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: tokenfab-weights-fetch-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.labels["app.kubernetes.io/component"]'
      operator: 'In'
      values: ['weights-fetch']
    - key: '.metadata.namespace | startswith("live-")'
      operator: 'NotIn'
      values: ['true']
  delay:
    durationMilliseconds: 2000
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodCompleted
        type: ContainersReady
      - lastTransitionTime: {{ $now | Quote }}
        status: "False"
        reason: PodCompleted
        type: Ready
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            finishedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""


# The scrape job tokenfab documents for a plain Prometheus (the chart's PodMonitor says the same).
SCRAPE_CONFIG = Path(__file__).resolve().parents[2] / "charts/tokenfab/prometheus/scrape-config.yaml"
# The engine is simulated by Dynamo's mocker, which names its metrics after vLLM's (`vllm:` or `trtllm:`
# prefixed, DP rank in label `engine`), not as the real TensorRT-LLM worker does. The factory's Prometheus
# renames the series the autoscaler reads to the real worker's (dynamo_component_gpu_cache_usage_percent per
# dp_rank, trtllm_num_requests_waiting): a translation of the hardware's stand-in, never in the operator.
MOCKER_METRICS: list[dict[str, Any]] = [
    {
        "source_labels": ["__name__", "engine"],
        "regex": "(trtllm|vllm):kv_cache_usage_perc;(.*)",
        "target_label": "dp_rank",
        "replacement": "$2",
    },
    {
        "source_labels": ["__name__"],
        "regex": "(trtllm|vllm):kv_cache_usage_perc",
        "target_label": "__name__",
        "replacement": "dynamo_component_gpu_cache_usage_percent",
    },
    {
        "source_labels": ["__name__"],
        "regex": "(trtllm|vllm):num_requests_waiting",
        "target_label": "__name__",
        "replacement": "trtllm_num_requests_waiting",
    },
]


def documented_scrape_job() -> dict[str, Any]:
    jobs = yaml.safe_load(SCRAPE_CONFIG.read_text())
    if not isinstance(jobs, list) or len(jobs) != 1:
        raise FactoryError(f"{SCRAPE_CONFIG}: expected one scrape job")
    return dict(jobs[0])


def write_kubeconfig(f: Layout) -> None:
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tokenfab",
                "cluster": {"server": f.apiserver_url, "certificate-authority": str(f.pki.ca_crt)},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate": str(f.pki.admin_crt),
                    "client-key": str(f.pki.admin_key),
                },
            }
        ],
        "contexts": [
            {
                "name": "tokenfab",
                "context": {"cluster": "tokenfab", "user": "admin", "namespace": "default"},
            }
        ],
        "current-context": "tokenfab",
    }
    f.kubeconfig.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    f.kubeconfig.chmod(0o600)


# How many simulated kubelets kwok runs at once. Every real node's kubelet renews its own Lease and reports
# its own pods; kwok's defaults (a few workers for all nodes) serialize them behind the API server's
# latency: on 2,304 nodes under a burst, Lease renewals fell from about 6,000 to 400-900 a minute and
# 1,400 nodes went NotReady (their pods never Ready again: kwok does not re-report them as a kubelet
# would). Enough lease workers keep every Lease renewed while each renewal waits seconds for its answer.
# Only for factories above LARGE_FACTORY_RACKS, where kwok's defaults were seen to fail: an earlier
# version of this document left options unset, and kwok (which does not default a configuration's
# options) renewed almost no Lease on 4 racks (9-20 renewals a minute for 72 nodes, against about 200).
LARGE_FACTORY_RACKS = 64
KWOK_CONFIGURATION = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
    "kind": "KwokConfiguration",
    # (a KwokConfiguration's options are not defaulted: every parallelism kwok needs is given, the others
    # at kwok's own defaults; a zero one fails its start-up)
    "options": {
        "nodeLeaseParallelism": 32,
        "nodePlayStageParallelism": 4,
        "podPlayStageParallelism": 4,
        "podsOnNodeSyncParallelism": 1,
    },
}


def write_kwok_config(f: Layout) -> None:
    stage_dir = f.config.bin_dir / "kwok-stage"
    docs = [yaml.safe_load((stage_dir / s).read_text()) for s in KWOK_STAGES]
    if f.config.racks > LARGE_FACTORY_RACKS:
        docs.insert(0, KWOK_CONFIGURATION)
    for doc in docs:
        if (
            doc["kind"] == "Stage" and doc["metadata"]["name"] == "pod-ready"
        ):  # not for the live namespaces (see LIVE_POD_START)
            doc["spec"]["selector"]["matchExpressions"].append(
                {
                    "key": f'.metadata.namespace | startswith("{LIVE_NAMESPACE_PREFIX}")',
                    "operator": "NotIn",
                    "values": ["true"],
                }
            )
    docs.append(yaml.safe_load(LIVE_POD_START))
    docs.append(yaml.safe_load(FETCH_POD_COMPLETE))
    (f.run / "kwok.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))


def write_prometheus_config(f: Layout) -> None:
    pki = f.pki
    config = {
        "global": {
            "scrape_interval": f.config.scrape_interval,
            "evaluation_interval": f.config.scrape_interval,
        },
        "scrape_configs": [
            {
                "job_name": "kube-apiserver",
                "scheme": "https",
                "tls_config": {
                    "ca_file": str(pki.ca_crt),
                    "cert_file": str(pki.admin_crt),
                    "key_file": str(pki.admin_key),
                },
                "scrape_interval": "15s",
                "static_configs": [{"targets": [f"127.0.0.1:{f.config.port('kube-apiserver')}"]}],
            },
            {
                # tokenfab's documented scrape job (Kubernetes pod discovery and its relabelling) on
                # the fleet runner's loopback targets, which carry the labels that discovery gives a
                # pod; the only addition is the mocker's metric names (MOCKER_METRICS)
                "job_name": "tokenfab",
                "file_sd_configs": [{"files": [str(f.file_sd_dir / "*.json")], "refresh_interval": "2s"}],
                "relabel_configs": documented_scrape_job()["relabel_configs"],
                "metric_relabel_configs": MOCKER_METRICS,
            },
        ],
    }
    path = f.run / "prometheus" / "prometheus.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def write_env(f: Layout) -> None:
    lines = [
        "# Source this file to use the local AI factory: `source " + str(f.env_file) + "`",
        f"export KUBECONFIG={f.kubeconfig}",
        f"export PATH={f.config.bin_dir}:{Path(sys.executable).parent}:$PATH",
        f"export TOKENFAB_FACTORY_DIR={f.run}",
        f"export TOKENFAB_PROMETHEUS_URL={f.prometheus_url}",
        f"export TOKENFAB_FILE_SD_DIR={f.file_sd_dir}",
    ]
    f.env_file.write_text("\n".join(lines) + "\n")
