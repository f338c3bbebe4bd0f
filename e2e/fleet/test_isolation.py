"""The fleet runner's per-pod mount namespaces (e2e/fleet/isolation.py), run for real without a cluster:
a process sees its own pod directory and not the others', a hidden path is empty for it, and nothing it
mounts or writes outside its own directory reaches the host."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e.fleet import isolation

pytestmark = [
    pytest.mark.unit,  # (beside the code it tests; needs no factory)
    pytest.mark.skipif(not isolation.available(), reason="mount namespaces need root and unshare"),
]


def _tree(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    pods, stage, model = tmp_path / "pods", tmp_path / ".stage", tmp_path / "model"
    for d in (pods / "a" / "home", pods / "b", stage, model):
        d.mkdir(parents=True)
    (pods / "a" / "kubeconfig").write_text("a's")
    (pods / "b" / "kubeconfig").write_text("b's")
    (model / "tokenizer.json").write_text("{}")
    return pods, stage, model, pods / "a"


def test_a_pod_sees_its_own_directory_only_and_not_what_it_does_not_mount(tmp_path):
    pods, stage, model, own = _tree(tmp_path)
    script = f"ls {pods}; echo ---; ls {model}; echo ---; cat {own}/kubeconfig; echo made > {own}/home/out"
    argv = isolation.isolated(["sh", "-c", script], own=own, pods=pods, stage=stage, hide=[model])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    listed_pods, listed_model, kubeconfig = out.split("---\n")
    assert listed_pods.split() == ["a"], "the other pods' directories are hidden"
    assert listed_model.split() == [], "the model it does not mount is hidden"
    assert kubeconfig.strip() == "a's"
    # what it wrote in its own directory is there on the host; the host's view is unchanged otherwise
    assert (own / "home" / "out").read_text() == "made\n"
    assert sorted(p.name for p in pods.iterdir()) == ["a", "b"]
    assert (model / "tokenizer.json").exists()
    assert not any(stage.iterdir())


def test_a_worker_keeps_the_model_it_mounts(tmp_path):
    pods, stage, model, own = _tree(tmp_path)
    argv = isolation.isolated(["ls", str(model)], own=own, pods=pods, stage=stage)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.split() == ["tokenizer.json"]


def test_a_pod_directory_outside_the_pods_directory_is_refused(tmp_path):
    pods, stage, _, _ = _tree(tmp_path)
    with pytest.raises(ValueError, match="is not under"):
        isolation.isolated(["true"], own=tmp_path, pods=pods, stage=stage)


def test_a_projected_volume_is_mounted_where_the_pod_mounts_it_and_nowhere_else(tmp_path):
    pods, stage, _, own = _tree(tmp_path)
    projected = own / "volumes" / "topology"
    projected.mkdir(parents=True)
    (projected / "unit").write_text("3")
    target = tmp_path / "etc" / "dynamo" / "topology"
    script = f"cat {target}/unit; echo; touch {target}/x 2>/dev/null && echo writable || echo read-only"
    argv = isolation.isolated(
        ["sh", "-c", script], own=own, pods=pods, stage=stage, volumes=[(projected, str(target))]
    )
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.split() == ["3", "read-only"]
    assert target.is_dir(), "the mount point is made"
    assert not any(target.iterdir()), "the host's mount point stays empty"
