"""The factory's components and their command lines: etcd, the Kubernetes control plane, kwok, Prometheus and
the simulated node drivers, with the flags a simulated fleet of NVL72 racks needs."""

from __future__ import annotations

import sys

from tokenfab_factory.config import Layout
from tokenfab_factory.racks import FACTORY_LABEL

# kwok renews each simulated node's Lease; on a busy 2-core machine with 1,152 nodes a renewal can lag,
# so leases are long and the controller-manager waits several of them before calling a node NotReady.
NODE_LEASE_SECONDS = 60
NODE_MONITOR_GRACE = "180s"
# Kubernetes 1.37's gang scheduling (Workload and PodGroup, scheduling.k8s.io/v1beta1) is beta and off by
# default (a beta API group is not served unless asked, and the GenericWorkload gate, which also turns on
# the scheduler's GangScheduling plugin, defaults to false): turned on here so the operator's PodGroup path
# runs end to end (the operator falls back to its scheduling gates without it). DRA device taints
# (DeviceTaintRule, resource.k8s.io/v1) are GA and on by default.
GANG_FEATURE_GATES = "GenericWorkload=true"
GANG_RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"
# Simulated pods get addresses from 198.18.0.0/15 (RFC 2544: reserved for benchmarking, never routed), which
# the endpoint controllers accept (loopback addresses they refuse with a Warning per Service). Nothing ever
# connects to them: every real process of the factory and the live fleet serves on 127.0.0.1.
POD_CIDR = "198.18.0.0/15"
DRIVERS_MODULE = "tokenfab_factory.drivers"


def argv(f: Layout, comp: str) -> list[str]:
    """The command line of one of the factory's components."""
    if comp in ("kube-controller-manager", "kube-scheduler"):
        return _controller(f, comp)
    build = {"etcd": _etcd, "kube-apiserver": _apiserver, "kwok": _kwok, "prometheus": _prometheus}
    if comp in build:
        return build[comp](f)
    if comp == "drivers":  # simulated node drivers: NVIDIA DRA (ComputeDomains, IMEX channels), local volumes
        return [
            sys.executable,
            "-m",
            DRIVERS_MODULE,
            f"--kubeconfig={f.kubeconfig}",
            f"--port={f.config.port(comp)}",
        ]
    raise ValueError(comp)


def _etcd(f: Layout) -> list[str]:
    client = f"http://127.0.0.1:{f.config.port('etcd')}"
    peer = f"http://127.0.0.1:{f.config.port('etcd-peer')}"
    return [
        f.binary("etcd"),
        "--name=tokenfab",
        f"--data-dir={f.run / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=tokenfab={peer}",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=8589934592",
        "--log-level=warn",
    ]


def _apiserver(f: Layout) -> list[str]:
    cfg, pki = f.config, f.pki
    return [
        f.binary("kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{cfg.port('etcd')}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={cfg.port('kube-apiserver')}",
        f"--tls-cert-file={pki.server_crt}",
        f"--tls-private-key-file={pki.server_key}",
        f"--client-ca-file={pki.ca_crt}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        "--event-ttl=2h",
        *(
            [f"--feature-gates={GANG_FEATURE_GATES}", f"--runtime-config={GANG_RUNTIME_CONFIG}"]
            if cfg.gang_api
            else []
        ),
    ]


def _controller(f: Layout, comp: str) -> list[str]:
    """The controller-manager's or the scheduler's command line."""
    cfg, pki, kc = f.config, f.pki, str(f.kubeconfig)
    out = [
        f.binary(comp),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={cfg.port(comp)}",
        "--leader-elect=false",
        "--profiling=false",
    ]
    if comp == "kube-controller-manager":
        out += [
            f"--root-ca-file={pki.ca_crt}",
            f"--service-account-private-key-file={pki.sa_key}",
            "--use-service-account-credentials=true",
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
            "--concurrent-gc-syncs=10",
        ]
    out += ["--kube-api-qps=200", "--kube-api-burst=400"]
    if cfg.gang_api:  # (the controller-manager's PodGroup protection controller removes their finalizer)
        out.append(f"--feature-gates={GANG_FEATURE_GATES}")
    return out


def _kwok(f: Layout) -> list[str]:
    return [
        f.binary("kwok"),
        f"--kubeconfig={f.kubeconfig}",
        f"--config={f.run / 'kwok.yaml'}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-label-selector={FACTORY_LABEL}",
        f"--cidr={POD_CIDR}",
        "--node-ip=127.0.0.1",
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
        f"--server-address=127.0.0.1:{f.config.port('kwok')}",
    ]


def _prometheus(f: Layout) -> list[str]:
    return [
        f.binary("prometheus"),
        f"--config.file={f.run / 'prometheus' / 'prometheus.yml'}",
        f"--storage.tsdb.path={f.run / 'prometheus' / 'data'}",
        f"--web.listen-address=127.0.0.1:{f.config.port('prometheus')}",
        "--storage.tsdb.retention.time=1d",
        "--web.enable-lifecycle",
    ]
