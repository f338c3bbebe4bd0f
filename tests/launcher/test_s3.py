"""s3:// weights (tokenfab.launcher.s3) fetched by the real launcher with the real boto3, from moto's S3
server on loopback, both in the venv e2e/fleet/setup.sh installs (boto3 pins python-dateutil<3, which the
operator's kubernetes client does not accept). The launcher runs as a weights-fetch pod runs it
(`--fetch-only`) and as a worker pod runs it (its engine's --model-path pointed at the fetched snapshot)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from testing.cases import env
from tests.launcher.test_launcher import (
    base_environ,
    fake_program,
    pod_args,
    rendered,
)
from tokenfab.launcher import fetch, s3
from tokenfab.launcher.weights import Fetch
from tokenfab.planning import contract

ROOT = Path(__file__).resolve().parents[2]
VENVS = Path(os.environ.get("TOKENFAB_VENVS", Path.home() / ".cache" / "tokenfab" / "venvs"))
S3_PYTHON = VENVS / "s3" / "bin" / "python"
BUCKET, PREFIX = "weights", "deepseek/r1"
SOURCE = f"s3://{BUCKET}/{PREFIX}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Writes to the store with boto3 itself (in the S3 venv): objects to put (name -> bytes, as latin-1 text)
# and names to delete, under the prefix, passed as JSON on stdin.
SEED = """
import json, sys, boto3
doc = json.load(sys.stdin)
client = boto3.client("s3")
if doc["create"]:
    client.create_bucket(Bucket=doc["bucket"])
for name, text in doc["put"].items():
    client.put_object(Bucket=doc["bucket"], Key=doc["prefix"] + "/" + name, Body=text.encode("latin-1"))
for name in doc["delete"]:
    client.delete_object(Bucket=doc["bucket"], Key=doc["prefix"] + "/" + name)
"""


class Store:
    """moto's S3 server on loopback, written to with boto3."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "tokenfab-test",
            "AWS_SECRET_ACCESS_KEY": "tokenfab-test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def write(
        self, put: dict[str, bytes] | None = None, delete: tuple[str, ...] = (), create: bool = False
    ) -> None:
        doc = {
            "bucket": BUCKET,
            "prefix": PREFIX,
            "create": create,
            "put": {n: d.decode("latin-1") for n, d in (put or {}).items()},
            "delete": list(delete),
        }
        subprocess.run(
            [str(S3_PYTHON), "-c", SEED],
            input=json.dumps(doc),
            env={"PATH": os.environ["PATH"], **self.env()},
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def put(self, name: str, data: bytes) -> None:
        self.write({name: data})

    def delete(self, name: str) -> None:
        self.write(delete=(name,))


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    """One moto S3 server for the module (a start costs seconds); each test empties it (`store`)."""
    assert S3_PYTHON.exists(), f"{S3_PYTHON} missing: e2e/fleet/setup.sh (run by e2e/test.sh) installs it"
    port = free_port()
    proc = subprocess.Popen(
        [str(S3_PYTHON), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "moto's server exited"
                assert time.monotonic() < deadline, "moto's server did not listen within 60 s"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def store(moto_server: str) -> Store:
    """The server emptied (moto's reset endpoint), with the test's bucket made anew."""
    reset = urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST")
    with urllib.request.urlopen(reset, timeout=30) as r:
        assert r.status == 200, r.status
    s = Store(moto_server)
    s.write(create=True)
    return s


def s3_environ(tmp_path: Path, store: Store) -> dict[str, str]:
    """A weights-fetch pod's variables, and what runtime.env would carry for an S3-compatible store."""
    return {
        **base_environ(),
        "PYTHONPATH": str(ROOT / "operator"),
        contract.ENV_MODEL_SOURCE: SOURCE,
        contract.ENV_MODEL_REVISION: "",
        contract.ENV_MODEL_CACHE: str(tmp_path / "model-cache"),
        fetch.ENV_TERMINATION_LOG: str(tmp_path / "termination-log"),
        **store.env(),
    }


def run(args: list[str], environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(S3_PYTHON), "-m", "tokenfab.launcher", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def snapshot_of(tmp_path: Path) -> Path:
    return s3.snapshot_dir(Fetch(f"{BUCKET}/{PREFIX}", None, str(tmp_path / "model-cache"), "s3"))


def said(tmp_path: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads((tmp_path / "termination-log").read_text())
    return doc


def test_fetch_only_downloads_what_changed_and_no_more(tmp_path, store):
    files = {"config.json": b'{"a": 1}', "model-00001.safetensors": b"x" * 5000, "sub/tok.json": b"t" * 70}
    store.write(files)
    environ = s3_environ(tmp_path, store)
    first = run(["--fetch-only"], environ)
    assert first.returncode == 0, first.stderr
    snap = snapshot_of(tmp_path)
    assert {n: (snap / n).read_bytes() for n in files} == files
    assert said(tmp_path)["source"] == "download"
    assert said(tmp_path)["bytes"] == sum(len(d) for d in files.values())
    assert said(tmp_path)["files"] == 3
    assert f"weights {SOURCE}@latest: 3 of 3 objects fetched" in first.stderr
    # nothing changed in the bucket: from the cache, nothing fetched
    second = run(["--fetch-only"], environ)
    assert second.returncode == 0, second.stderr
    assert said(tmp_path)["source"] == "cache"
    assert "objects fetched" not in second.stderr
    # one object rewritten (same size, other bytes: another ETag), one removed, one added
    store.write(
        {"model-00001.safetensors": b"y" * 5000, "model-00002.safetensors": b"z" * 300}, ("sub/tok.json",)
    )
    third = run(["--fetch-only"], environ)
    assert third.returncode == 0, third.stderr
    assert "2 of 3 objects fetched" in third.stderr
    assert (snap / "model-00001.safetensors").read_bytes() == b"y" * 5000
    assert not (snap / "sub" / "tok.json").exists()
    assert said(tmp_path)["bytes"] == len(b'{"a": 1}') + 5000 + 300


def test_a_store_that_does_not_answer_leaves_a_verified_snapshot_in_use(tmp_path, store):
    store.put("config.json", b"{}")
    environ = s3_environ(tmp_path, store)
    assert run(["--fetch-only"], environ).returncode == 0
    down = {**environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_MAX_ATTEMPTS": "1"}
    kept = run(["--fetch-only"], down)
    assert kept.returncode == 0, kept.stderr
    assert "S3 did not answer" in kept.stderr
    # with nothing verified in the cache: the launch fails with the reason
    (snapshot_of(tmp_path) / ".tokenfab-manifest.json").unlink()
    failed = run(["--fetch-only"], down)
    assert failed.returncode == 1
    assert f"weights {SOURCE}@latest could not be listed: EndpointConnectionError" in failed.stderr


def test_an_empty_prefix_and_a_missing_boto3_fail_with_the_reason(tmp_path, store):
    environ = s3_environ(tmp_path, store)
    empty = run(["--fetch-only"], environ)
    assert empty.returncode == 1
    assert f"no object under s3://{BUCKET}/{PREFIX}/" in empty.stderr
    # an image without boto3 (a package that fails to import stands in for it, ahead on the path)
    shadow = tmp_path / "no-boto3" / "boto3"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("no boto3 in this image")\n')
    missing = run(["--fetch-only"], {**environ, "PYTHONPATH": f"{shadow.parent}:{environ['PYTHONPATH']}"})
    assert missing.returncode == 127
    assert "boto3 is not installed" in missing.stderr


def test_the_worker_loads_the_snapshot_it_fetched(tmp_path, store):
    """A worker pod of an s3:// spec: the launcher fetches, then the engine's --model-path is the snapshot."""
    store.put("config.json", b"{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_program(bin_dir, "python3", 'echo "$@" > "$FAKE_DIR/python3.args"\n')
    _, [pod], engine_yaml = rendered("aggregated-small.yaml", "worker", {"model": {"source": SOURCE}})
    engine = tmp_path / "engine.yaml"
    engine.write_text(engine_yaml)
    pod_env = env(pod)
    assert pod_env[contract.ENV_MODEL_SOURCE] == SOURCE
    environ = {
        **pod_env,
        **s3_environ(tmp_path, store),
        contract.ENV_ENGINE_CONFIG: str(engine),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "TMPDIR": str(tmp_path),
    }
    done = run(pod_args(pod), environ)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "python3.args").read_text().split()
    assert argv[argv.index("--model-path") + 1] == str(snapshot_of(tmp_path))
    assert f"weights {SOURCE}@latest: {snapshot_of(tmp_path)} (fetched into the model cache" in done.stderr


@pytest.mark.parametrize(
    ("name", "unsafe"),
    [("a/b.safetensors", False), ("../escape", True), ("a/../../x", True), (".tokenfab-manifest.json", True)],
)
def test_object_names_that_would_leave_the_snapshot_are_refused(name, unsafe):
    assert s3.unsafe(name) is unsafe


def test_the_boto3_tested_here_is_the_one_the_worker_image_ships():
    dockerfile = (ROOT / "runtime-images" / "worker" / "Dockerfile").read_text()
    setup = (ROOT / "e2e" / "fleet" / "setup.sh").read_text()
    [image] = re.findall(r"^ARG BOTO3_VERSION=(\S+)$", dockerfile, re.M)
    [tested] = re.findall(r"^BOTO3_VERSION=(\S+)$", setup, re.M)
    assert image == tested
    installed = subprocess.run(
        [str(S3_PYTHON), "-c", "import boto3; print(boto3.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert installed == tested
