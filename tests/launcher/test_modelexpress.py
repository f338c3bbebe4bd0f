"""hf:// weights from a ModelExpress server's model cache (tokenfab.launcher.modelexpress), optional.

No ModelExpress server runs here (a Rust service, with GPUs for its peer transfers), and its Python
package pulls torch: the launcher is run against a stand-in `modelexpress` package that installs a
snapshot as the real client does (a Hugging Face snapshot named after the commit, in the cache directory
it is given). The calls the launcher makes are checked against the pinned release's own source (the wheel
e2e/fleet/setup.sh downloads), so a rename on either side fails here."""

from __future__ import annotations

import ast
import json
import os
import zipfile
from pathlib import Path

from tests.launcher.test_launcher import COMMIT, fetch_only_environ, hub_down, launcher
from tokenfab.launcher import modelexpress

VENVS = Path(os.environ.get("TOKENFAB_VENVS", Path.home() / ".cache" / "tokenfab" / "venvs"))
WHEELS = VENVS / "wheels"
MODELEXPRESS_VERSION = "0.7.0"

# The stand-in: records its calls, installs config.json and a weights file as the server would; with
# FAKE_MX_FAIL set, the server does not answer.
STAND_IN = """
import json, os
from pathlib import Path

class ModelCacheClient:
    def __init__(self, server_url=None, cache_directory=None, chunk_size=None, max_message_size=1):
        self.server_url, self.cache = server_url, Path(cache_directory)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return None
    def _log(self, *call):
        with open(os.environ["FAKE_MX_CALLS"], "a") as f:
            f.write(json.dumps([self.server_url, *call]) + "\\n")
    def install_metadata_snapshot(self, model_name, provider=0, requested_revision=None):
        self._log("metadata", model_name, requested_revision)
        if os.environ.get("FAKE_MX_FAIL"):
            raise ConnectionError("no ModelExpress server answers")
        repo = self.cache / ("models--" + model_name.replace("/", "--"))
        snap = repo / "snapshots" / os.environ["FAKE_MX_COMMIT"]
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "config.json").write_text("{}")
        return snap
    def install_weight_files(self, model_name, snapshot_path, provider=0):
        self._log("weights", model_name, str(snapshot_path))
        (Path(snapshot_path) / "model.safetensors").write_bytes(b"w" * 4096)
"""


def stand_in(tmp_path: Path) -> dict[str, str]:
    pkg = tmp_path / "mx" / "modelexpress"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model_client.py").write_text(STAND_IN)
    return {
        "PYTHONPATH": os.pathsep.join([str(pkg.parent), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "FAKE_MX_CALLS": str(tmp_path / "calls.jsonl"),
        "FAKE_MX_COMMIT": COMMIT,
    }


def calls(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_named_server_serves_the_weights_before_the_hub(tmp_path):
    environ = {
        **hub_down(fetch_only_environ(tmp_path, revision=COMMIT)),
        **stand_in(tmp_path),
        "MODEL_EXPRESS_URL": "127.0.0.1:8001",
    }
    done = launcher(["--fetch-only"], environ)
    assert done.returncode == 0, done.stderr
    snapshot = tmp_path / "model-cache" / "models--org--model" / "snapshots" / COMMIT
    assert calls(tmp_path) == [
        ["127.0.0.1:8001", "metadata", "org/model", COMMIT],
        ["127.0.0.1:8001", "weights", "org/model", str(snapshot)],
    ]
    said = json.loads((tmp_path / "termination-log").read_text())
    assert (said["source"], said["files"], said["bytes"]) == ("modelexpress", 2, 4096 + 2)
    assert f"commit {COMMIT} from the ModelExpress server at 127.0.0.1:8001" in done.stderr
    # a later pod of the node: complete in the model cache, no server asked
    again = launcher(["--fetch-only"], environ)
    assert again.returncode == 0, again.stderr
    assert len(calls(tmp_path)) == 2
    assert json.loads((tmp_path / "termination-log").read_text())["source"] == "cache"


def test_a_server_that_does_not_serve_or_no_package_leaves_it_to_the_hub(tmp_path):
    base = hub_down(fetch_only_environ(tmp_path, revision=COMMIT))
    failing = launcher(
        ["--fetch-only"],
        {**base, **stand_in(tmp_path), "MX_SERVER_ADDRESS": "127.0.0.1:8001", "FAKE_MX_FAIL": "1"},
    )
    assert "the ModelExpress server at 127.0.0.1:8001 did not serve them (ConnectionError" in failing.stderr
    assert "could not be fetched" in failing.stderr  # (then the hub, which is down here)
    assert failing.returncode == 1
    missing = launcher(["--fetch-only"], {**base, "MODEL_EXPRESS_URL": "127.0.0.1:8001"})
    assert "this image has no modelexpress package: from the hub" in missing.stderr
    assert missing.returncode == 1
    # no server named: ModelExpress is never asked
    plain = launcher(["--fetch-only"], {**base, **stand_in(tmp_path / "plain")})
    assert "ModelExpress" not in plain.stderr
    assert calls(tmp_path / "plain") == []


def _pinned_source(name: str) -> ast.Module:
    wheels = sorted(WHEELS.glob(f"modelexpress-{MODELEXPRESS_VERSION}-*.whl"))
    assert wheels, (
        f"no modelexpress {MODELEXPRESS_VERSION} wheel in {WHEELS}: e2e/fleet/setup.sh downloads it"
    )
    with zipfile.ZipFile(wheels[0]) as whl:
        return ast.parse(whl.read(f"modelexpress/{name}").decode())


def _params(tree: ast.Module, cls: str, method: str) -> list[str]:
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return [a.arg for a in fn.args.args]


def test_the_calls_match_the_pinned_modelexpress_release():
    setup = (Path(__file__).resolve().parents[2] / "e2e" / "fleet" / "setup.sh").read_text()
    assert f"MODELEXPRESS_VERSION={MODELEXPRESS_VERSION}" in setup
    client = _pinned_source("model_client.py")
    init = _params(client, "ModelCacheClient", "__init__")
    assert init[:3] == ["self", "server_url", "cache_directory"]
    assert "requested_revision" in _params(client, "ModelCacheClient", "install_metadata_snapshot")
    assert _params(client, "ModelCacheClient", "install_weight_files")[:3] == [
        "self",
        "model_name",
        "snapshot_path",
    ]
    assert {"__enter__", "__exit__"} <= {
        n.name
        for k in client.body
        if isinstance(k, ast.ClassDef) and k.name == "ModelCacheClient"
        for n in k.body
        if isinstance(n, ast.FunctionDef)
    }
    # the server's address: the variables the launcher reads, in ModelExpress' order of precedence
    envs = ast.unparse(_pinned_source("envs.py"))
    assert all(f"'{v}'" in envs or f'"{v}"' in envs for v in modelexpress.SERVER_VARIABLES)
    lookup = ast.unparse(_pinned_source("client.py"))
    first, second = (lookup.index(f"envs.{v}") for v in modelexpress.SERVER_VARIABLES)
    assert first < second
