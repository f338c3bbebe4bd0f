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
    cfg, pki, run = f.config, f.pki, f.run
    kc = str(f.kubeconfig)
    if comp == "etcd":
        client, peer = f"http://127.0.0.1:{cfg.port('etcd')}", f"http://127.0.0.1:{cfg.port('etcd-peer')}"
        return [
            f.binary("etcd"),
            "--name=tokenfab",
            f"--data-dir={run / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=tokenfab={peer}",
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ]
    if comp == "kube-apiserver":
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
    if comp in ("kube-controller-manager", "kube-scheduler"):
        argv = [
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
            argv += [
                f"--root-ca-file={pki.ca_crt}",
                f"--service-account-private-key-file={pki.sa_key}",
                "--use-service-account-credentials=true",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                "--concurrent-gc-syncs=10",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ]
            if cfg.gang_api:  # the PodGroup protection controller (removes PodGroups' finalizer)
                argv.append(f"--feature-gates={GANG_FEATURE_GATES}")
        else:
            argv += ["--kube-api-qps=200", "--kube-api-burst=400"]
            if cfg.gang_api:
                argv.append(f"--feature-gates={GANG_FEATURE_GATES}")
        return argv
    if comp == "kwok":
        return [
            f.binary("kwok"),
            f"--kubeconfig={kc}",
            f"--config={run / 'kwok.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-label-selector={FACTORY_LABEL}",
            f"--cidr={POD_CIDR}",
            "--node-ip=127.0.0.1",
            f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            f"--server-address=127.0.0.1:{cfg.port('kwok')}",
        ]
    if comp == "prometheus":
        return [
            f.binary("prometheus"),
            f"--config.file={run / 'prometheus' / 'prometheus.yml'}",
            f"--storage.tsdb.path={run / 'prometheus' / 'data'}",
            f"--web.listen-address=127.0.0.1:{cfg.port('prometheus')}",
            "--storage.tsdb.retention.time=1d",
            "--web.enable-lifecycle",
        ]
    if comp == "drivers":  # simulated node drivers: NVIDIA DRA (ComputeDomains, IMEX channels), local volumes
        return [
            sys.executable,
            "-m",
            DRIVERS_MODULE,
            f"--kubeconfig={kc}",
            f"--port={cfg.port(comp)}",
        ]
    raise ValueError(comp)
