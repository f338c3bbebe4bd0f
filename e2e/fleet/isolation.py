"""Each pod's own filesystem, as a kubelet gives it: the fleet runner starts every pod's process in a mount
namespace of its own (`unshare --mount`, private propagation), where the runner's per-pod directories are
hidden behind an empty tmpfs except the pod's own (its HOME and its ServiceAccount kubeconfig), and the
paths the pod does not mount are hidden too: the frontend mounts no model, so it sees no model files and
must get the model card from the workers as it would on a cluster (Dynamo's self-hosted card files, served
on each worker's system port), or fail. A pod's downward-API volumes (a unit member's topology file, which
Dynamo reads its KV-transfer domain from) are projected by the runner and mounted where the pod mounts
them.

Nothing here is written to the host: the tmpfs mounts exist in the process's namespace only, and go with
it. Mounting needs root (CI and the factory run as root); elsewhere the runner says so and runs the
process unisolated (`available`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

# $1 stage (an empty directory, mounted over in the namespace only), $2 the pod's own directory, $3 the
# directory of every pod's directory, $4 the paths to hide, ':'-separated, $5 the volumes to mount, each
# SOURCE=TARGET, ':'-separated; then the command.
SCRIPT = """set -e
stage=$1 own=$2 pods=$3 hide=$4 binds=$5
shift 5
mount -t tmpfs tokenfab-pod "$stage"
mkdir "$stage/own"
mount --bind "$own" "$stage/own"
mount -t tmpfs tokenfab-pods "$pods"
mkdir -p "$own"
mount --bind "$stage/own" "$own"
IFS=:
for path in $hide; do
  mount -t tmpfs tokenfab-hidden "$path"
done
for bind in $binds; do
  mkdir -p "${bind#*=}"
  mount --bind -o ro "${bind%%=*}" "${bind#*=}"
done
unset IFS
exec "$@"
"""


def available() -> bool:
    """Whether processes can be given a mount namespace of their own here (root, and unshare present)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None and shutil.which("mount") is not None


def isolated(
    argv: Sequence[str],
    *,
    own: Path,
    pods: Path,
    stage: Path,
    hide: Sequence[Path] = (),
    volumes: Sequence[tuple[Path, str]] = (),
) -> list[str]:
    """`argv` run in a mount namespace of its own: `own` (under `pods`) is the only pod directory it
    sees, each of `hide` is empty there, and each of `volumes` (a directory the runner projected, and
    where the container mounts it) is mounted read-only at its path, as a kubelet mounts a pod's volumes
    (the mount point is made if missing). `stage` is an empty directory the mounts are staged on."""
    if not own.is_relative_to(pods):
        raise ValueError(f"{own} is not under {pods}")
    paths = [str(p) for p in hide] + [f"{s}={t}" for s, t in volumes]
    if any(":" in p for p in paths) or any("=" in str(s) for s, _ in volumes):
        raise ValueError(f"a path may not contain ':' (nor a volume's source '='): {paths}")
    hidden = ":".join(str(p) for p in hide)
    binds = ":".join(f"{s}={t}" for s, t in volumes)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        SCRIPT,
        "tokenfab-pod",
        str(stage),
        str(own),
        str(pods),
        hidden,
        binds,
        *argv,
    ]
