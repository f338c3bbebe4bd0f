"""pvc:// weights copied from their claim into the node's model cache (tokenfab.launcher.mirror.copy) when
the spec names a storage class: by a weights-fetch pod (`--fetch-only`) and by a worker's launcher."""

from __future__ import annotations

import json
import os
from pathlib import Path

from testing.cases import env
from tests.launcher.test_launcher import base_environ, fake_program, launcher, pod_args, rendered
from tests.planning.test_prestage import first_owner
from tokenfab.launcher import fetch, mirror
from tokenfab.planning import builders, contract, launcher_log

SOURCE = "pvc://models/deepseek/r1"


def environ(tmp_path: Path) -> dict[str, str]:
    return {
        **base_environ(),
        contract.ENV_MODEL_SOURCE: SOURCE,
        contract.ENV_MODEL_REVISION: "",
        contract.ENV_MODEL_CACHE: str(tmp_path / "model-cache"),
        fetch.ENV_TERMINATION_LOG: str(tmp_path / "termination-log"),
        mirror.ENV_MODEL_MOUNT: str(tmp_path / "claim"),  # (the claim's root, /models in the pod)
    }


def said(tmp_path: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads((tmp_path / "termination-log").read_text())
    return doc


def test_fetch_only_copies_what_changed_from_the_claim(tmp_path):
    src = tmp_path / "claim" / "deepseek" / "r1"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"w" * 3000)
    (src / "sub" / "tok.json").write_text("t" * 10)
    first = launcher(["--fetch-only"], environ(tmp_path))
    assert first.returncode == 0, first.stderr
    local = tmp_path / "model-cache" / "pvc" / "models" / "deepseek" / "r1"
    assert (local / "model.safetensors").read_bytes() == b"w" * 3000
    assert (said(tmp_path)["source"], said(tmp_path)["files"], said(tmp_path)["bytes"]) == ("copy", 3, 3012)
    assert f"weights {SOURCE}@latest: 3 of 3 files copied" in first.stderr
    # the lines the operator reads from the pod's log: the copy's bytes, then where the weights came from
    got = launcher_log.read(first.stderr)
    assert got.progress is not None
    assert got.progress.bytes >= 3012
    assert got.result == launcher_log.Outcome("copy", 3012, 3, got.result.seconds if got.result else -1)
    again = launcher(["--fetch-only"], environ(tmp_path))
    assert again.returncode == 0, again.stderr
    assert said(tmp_path)["source"] == "cache"
    # one file rewritten (a new modification time), one removed
    (src / "model.safetensors").write_bytes(b"v" * 3000)
    os.utime(src / "model.safetensors", ns=(1, 1))
    (src / "sub" / "tok.json").unlink()
    third = launcher(["--fetch-only"], environ(tmp_path))
    assert third.returncode == 0, third.stderr
    assert "1 of 2 files copied" in third.stderr
    assert (local / "model.safetensors").read_bytes() == b"v" * 3000
    assert not (local / "sub" / "tok.json").exists()


def test_a_missing_directory_fails_with_the_reason(tmp_path):
    done = launcher(["--fetch-only"], environ(tmp_path))
    assert done.returncode == 1
    assert "is not a directory (the claim is mounted at its root)" in done.stderr


def test_a_worker_with_a_storage_class_loads_its_copy_and_one_without_loads_the_claim(tmp_path):
    src = tmp_path / "claim" / "deepseek" / "r1"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir, "python3", 'echo "$@" > "$FAKE_DIR/python3.args"\n')
    for cache, want in (
        ({"storageClassName": "local-nvme"}, tmp_path / "model-cache" / "pvc" / "models" / "deepseek" / "r1"),
        ({}, Path(contract.MODEL_MOUNT) / "deepseek" / "r1"),
    ):
        patch = {"model": {"source": SOURCE, "cache": cache}}
        _, [pod], engine_yaml = rendered("aggregated-small.yaml", "worker", patch)
        (tmp_path / "engine.yaml").write_text(engine_yaml)
        pod_env = env(pod)
        assert (contract.ENV_MODEL_CACHE in pod_env) is bool(cache)
        run_env = {
            **pod_env,
            **{k: v for k, v in environ(tmp_path).items() if k != contract.ENV_MODEL_CACHE or cache},
            contract.ENV_ENGINE_CONFIG: str(tmp_path / "engine.yaml"),
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "FAKE_DIR": str(tmp_path),
            "TMPDIR": str(tmp_path),
        }
        done = launcher(pod_args(pod), run_env)
        assert done.returncode == 0, done.stderr
        argv = (tmp_path / "python3.args").read_text().split()
        assert argv[argv.index("--model-path") + 1] == str(want)
        # a worker's launcher says where its weights came from (none fetched: mounted from the claim)
        result = launcher_log.read(done.stderr).result
        assert (result.source if result else None) == ("copy" if cache else None)


def test_the_fetch_pod_of_pvc_weights_mounts_their_claim_read_only():
    spec = rendered(
        "aggregated-small.yaml",
        "worker",
        {"model": {"source": SOURCE, "cache": {"storageClassName": "local-nvme", "prestageGroups": 1}}},
    )[0]
    pod = builders.weights_fetch_pod(first_owner(), spec, "a-0", "pvc://models/deepseek/r1@main")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": contract.MODEL_MOUNT, "readOnly": True}
    assert "model-cache" in mounts


def test_two_pods_copying_into_one_shared_cache_copy_once(tmp_path):
    """Deployments of one source share a node's model cache: a second pod's copy waits for the first's
    (a lock beside the snapshot), then finds the cache current and copies nothing; no half-written file
    of one is removed or hashed by the other."""
    import threading

    from tokenfab.launcher.weights import Fetch

    src = tmp_path / "claim" / "deepseek" / "r1"
    src.mkdir(parents=True)
    for i in range(4):
        (src / f"model-{i}.safetensors").write_bytes(bytes([i]) * 5000)
    env_ = environ(tmp_path)
    copies: list[str] = []
    started = threading.Event()
    real = mirror.sync

    def slow_sync(local, files, todo, get):  # (the first copy takes a while; the second starts meanwhile)
        copies.append(f"{len(todo)} files")
        started.set()
        threading.Event().wait(0.3)
        real(local, files, todo, get)

    mirror.sync = slow_sync  # type: ignore[assignment]
    try:
        fetch_ = Fetch("models/deepseek/r1", None, str(tmp_path / "model-cache"), scheme="pvc")
        got: list[str] = []
        told: dict[str, list[bool]] = {"first": [], "second": []}

        def one(who: str) -> None:
            got.append(mirror.copy(fetch_, env_, told[who].append).source)

        first = threading.Thread(target=one, args=("first",))
        first.start()
        started.wait(5)
        second = threading.Thread(target=one, args=("second",))
        second.start()
        first.join(10)
        second.join(10)
    finally:
        mirror.sync = real  # type: ignore[assignment]
    assert copies == ["4 files"]  # (one copy only: the second found the cache current)
    assert sorted(got) == ["cache", "copy"]
    # the second was told it waits (a signal then stops it at once, as during a download of its own)
    assert (told["first"], told["second"]) == ([True, False], [True, False])
    local = tmp_path / "model-cache" / "pvc" / "models" / "deepseek" / "r1"
    assert not [p for p in local.rglob("*") if "tokenfab-part" in p.name]
