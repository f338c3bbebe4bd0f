"""What a fetch of weights gives back, or how it failed: shared by each source's fetch (hf://, the
tokenfab.launcher.fetch; s3://, tokenfab.launcher.s3; pvc:// copies, tokenfab.launcher.mirror) and the
launcher that runs them (tokenfab.launcher.run). No I/O but the log line."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from tokenfab.launcher.plan import PROGRAM
from tokenfab.launcher.weights import WeightsSource

EXIT_FAILED = 1
EXIT_NOT_FOUND = 127


def log(message: str) -> None:
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)


class LaunchError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Obtained:
    """Where the weights are now and how they came: the snapshot's directory, the source, the seconds a
    download took, and what the manifest check said ("" when not checked)."""

    path: str
    source: WeightsSource
    seconds: float
    checked: str

    def origin(self) -> str:
        return {
            "cache": f"complete in the model cache{self.checked}",
            "download": f"fetched into the model cache in {self.seconds:.0f} s",
            "offline": "from the model cache, HF_HUB_OFFLINE (not checked against the hub)",
            "modelexpress": f"from the ModelExpress server's model cache in {self.seconds:.0f} s",
            "copy": f"copied into the model cache from its claim in {self.seconds:.0f} s",
        }[self.source]
