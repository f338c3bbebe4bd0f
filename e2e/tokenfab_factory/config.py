"""What a factory is: its configuration (racks, GPU system, ports, where its binaries are) and its layout
(where a run directory keeps its certificates, kubeconfig, env file, logs and state, and the URLs its
components serve on). Imported by the rest of the package; imports only the PKI's paths."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tokenfab_factory.pki import Pki

COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "prometheus",
    "drivers",
)
PORT_OFFSETS = {
    "etcd": 0,
    "etcd-peer": 1,
    "kube-apiserver": 2,
    "kube-controller-manager": 3,
    "kube-scheduler": 4,
    "kwok": 5,
    "prometheus": 6,
    "drivers": 7,
}


class FactoryError(RuntimeError):
    """Something the user must act on; the message says what."""


def default_run_dir() -> Path:
    env = os.environ.get("TOKENFAB_FACTORY_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "tokenfab" / "factory"


def default_bin_dir() -> Path:
    env = os.environ.get("TOKENFAB_BIN")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "tokenfab" / "bin" / "current"


@dataclass
class FactoryConfig:
    """What to bring up, and where."""

    run_dir: Path = field(default_factory=default_run_dir)
    racks: int = 4
    gpu: str = "gb200"
    port_base: int = 31000
    bin_dir: Path = field(default_factory=default_bin_dir)
    scrape_interval: str = "2s"
    gang_api: bool = True  # serve the alpha PodGroup gang API (feature gates on apiserver and scheduler)
    # An API server and its etcd only (no controllers, scheduler, nodes, Prometheus or drivers): a cluster
    # with nothing tokenfab needs, for the checks that say so.
    bare: bool = False

    @property
    def components(self) -> tuple[str, ...]:
        return ("etcd", "kube-apiserver") if self.bare else COMPONENTS

    def port(self, component: str) -> int:
        return self.port_base + PORT_OFFSETS[component]

    @property
    def name(self) -> str:
        """The run directory's name as a valid label value (it labels the factory's nodes)."""
        return re.sub(r"[^A-Za-z0-9._-]", "-", self.run_dir.name)[:63].strip("-_.") or "factory"


class Layout:
    """Where one factory run directory keeps its files, and where its components serve."""

    def __init__(self, config: FactoryConfig) -> None:
        self.config = config
        self.run = config.run_dir
        self.pki = Pki(self.run / "pki")

    # ------------------------------------------------------------------ paths
    @property
    def kubeconfig(self) -> Path:
        return self.run / "kubeconfig"

    @property
    def env_file(self) -> Path:
        return self.run / "env"

    @property
    def state_file(self) -> Path:
        return self.run / "state.json"

    @property
    def file_sd_dir(self) -> Path:
        """Drop Prometheus file_sd target files (*.json) here; they are picked up within seconds."""
        return self.run / "prometheus" / "file_sd"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.config.port('prometheus')}"

    @property
    def apiserver_url(self) -> str:
        return f"https://127.0.0.1:{self.config.port('kube-apiserver')}"

    def log(self, component: str) -> Path:
        return self.run / "logs" / f"{component}.log"

    def binary(self, name: str) -> str:
        if name == "prometheus":
            found = shutil.which("prometheus")
            if not found:
                raise FactoryError(
                    "prometheus not found: install Debian's package (apt-get install prometheus)"
                )
            return found
        path = self.config.bin_dir / name
        if not path.exists():
            raise FactoryError(f"{path} missing: build the toolchain with e2e/toolchain/build.sh")
        return str(path)
