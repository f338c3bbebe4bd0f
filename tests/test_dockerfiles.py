"""The runtime images' Dockerfiles, checked for form (no image can be built here: no container engine).

Pinned bases, a numeric non-root USER, no remote ADD, no secrets, COPY sources that exist and that the
image's .dockerignore lets through, and entrypoints, ports and versions that match what the operator
gives its pods (tokenfab.planning.builders and contract): the images and the reconciler agree.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from testing.cases import DOMAIN, ROOT, owner, spec_of
from tokenfab.cli import app
from tokenfab.planning import builders, contract

IMAGES = ROOT / "runtime-images"
NAMES = ("worker", "frontend", "operator")
VERSION = re.compile(r"\d+\.\d+\.\d+")

Instruction = tuple[str, str]


def instructions(path: Path) -> list[Instruction]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[Instruction] = []
    buf = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or (not buf and not stripped):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path}: dangling line continuation"
    return out


def dockerfile(name: str) -> Path:
    return IMAGES / name / "Dockerfile"


def args_of(instrs: list[Instruction]) -> dict[str, str]:
    """ARG defaults (all of them: the names are distinct in these files)."""
    out = {}
    for word, rest in instrs:
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            out[key] = value
    return out


def substitute(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], m[0]), text)


def bases(name: str) -> list[str]:
    instrs = instructions(dockerfile(name))
    values = args_of(instrs)
    stages: set[str] = set()
    out = []
    for word, rest in instrs:
        if word != "FROM":
            continue
        parts = [p for p in rest.split() if not p.startswith("--")]
        image = substitute(parts[0], values)
        if len(parts) == 3 and parts[1].upper() == "AS":
            stages.add(parts[2])
        if image not in stages:
            out.append(image)
    return out


def last(name: str, word: str) -> str:
    found = [rest for w, rest in instructions(dockerfile(name)) if w == word]
    assert found, f"{name}: no {word}"
    return found[-1]


def exec_form(name: str, word: str) -> list[str]:
    value = json.loads(last(name, word))
    assert isinstance(value, list), f"{name}: {word} must be in exec form (a JSON list)"
    return value


def env_of(name: str) -> dict[str, str]:
    out = {}
    for word, rest in instructions(dockerfile(name)):
        if word == "ENV":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                out[key] = value
    return out


def exposed(name: str) -> set[int]:
    return {
        int(p.split("/")[0])
        for w, rest in instructions(dockerfile(name))
        if w == "EXPOSE"
        for p in rest.split()
    }


# --------------------------------------------------------------------------------------------- form


@pytest.mark.parametrize("name", NAMES)
def test_every_base_image_is_pinned_by_version(name):
    found = bases(name)
    assert found, f"{name}: no FROM"
    for image in found:
        assert "$" not in image, f"{name}: unresolved argument in FROM {image}"
        repo, _, tag = image.rpartition(":")
        assert repo, f"{name}: FROM {image} has no tag"
        assert tag != "latest"
        assert VERSION.match(tag), f"{name}: FROM {image} is not pinned by an exact version"


def test_the_expected_bases():
    dynamo = args_of(instructions(dockerfile("worker")))["DYNAMO_VERSION"]
    assert bases("worker") == [f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{dynamo}"]
    for name in ("frontend", "operator"):
        for image in bases(name):
            assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", image), image


def test_worker_and_frontend_use_the_same_dynamo_version():
    worker = args_of(instructions(dockerfile("worker")))["DYNAMO_VERSION"]
    frontend = args_of(instructions(dockerfile("frontend")))["DYNAMO_VERSION"]
    assert worker == frontend
    assert VERSION.fullmatch(worker)
    assert '"ai-dynamo==${DYNAMO_VERSION}"' in dockerfile("frontend").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_runs_as_a_numeric_non_root_user(name):
    user = last(name, "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), f"{name}: USER {user} is not numeric (Kubernetes runAsNonRoot needs a uid)"
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)
    # Nothing after the final USER switches back to root.
    words = [w for w, _ in instructions(dockerfile(name))]
    assert "USER" not in words[len(words) - words[::-1].index("USER") :]


@pytest.mark.parametrize("name", NAMES)
def test_no_remote_add(name):
    for word, rest in instructions(dockerfile(name)):
        if word == "ADD":
            assert not re.search(r"(https?|git|ftp)://|git@", rest), f"{name}: ADD {rest}"


SECRET_PATTERNS = [
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    r"\bhf_[A-Za-z0-9]{20,}",
    r"\bgh[pousr]_[A-Za-z0-9]{20,}",
    r"\bnvapi-[A-Za-z0-9_-]{20,}",
    r"AKIA[0-9A-Z]{16}",
]


@pytest.mark.parametrize("name", NAMES)
def test_no_secrets(name):
    text = dockerfile(name).read_text()
    for pattern in SECRET_PATTERNS:
        assert not re.search(pattern, text), f"{name}: looks like a secret ({pattern})"
    for word, rest in instructions(dockerfile(name)):
        if word in ("ENV", "ARG"):
            names = [t.partition("=")[0] for t in shlex.split(rest)]
            for n in names:
                assert not re.search(r"TOKEN|SECRET|PASSWORD|API_?KEY", n, re.I), f"{name}: {word} {n}"


@pytest.mark.parametrize("name", NAMES)
def test_copy_sources_exist_and_pass_the_dockerignore(name):
    ignore = (IMAGES / name / "Dockerfile.dockerignore").read_text().split("\n")
    rules = [line.strip() for line in ignore if line.strip() and not line.startswith("#")]
    assert rules[0] == "*", "the context is the repository root: exclude everything, then list what is copied"
    allowed = {r[1:] for r in rules if r.startswith("!")}
    copies = [rest for w, rest in instructions(dockerfile(name)) if w == "COPY" and "--from=" not in rest]
    assert copies
    for rest in copies:
        *sources, _target = [p for p in rest.split() if not p.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"{name}: COPY {source}: no such path in the repository"
            assert source in allowed, f"{name}: COPY {source} is not let through by Dockerfile.dockerignore"


@pytest.mark.parametrize("name", NAMES)
def test_arm64_is_built_and_said(name):
    assert "arm64" in dockerfile(name).read_text()


# ------------------------------------------------------------------------- entrypoints match the pods


def test_worker_entrypoint_is_the_worker_pods_command():
    spec = spec_of("deepseek-r1-disaggregated.yaml")
    pods = builders.group_pods(owner("deepseek-r1"), spec, builders.GroupAt("decode", 0, DOMAIN, "rev"))
    assert exec_form("worker", "ENTRYPOINT") == pods[0]["spec"]["containers"][0]["command"]
    assert exec_form("worker", "ENTRYPOINT") == [contract.PYTHON, "-m", contract.LAUNCHER_MODULE]
    assert exposed("worker") == {contract.WORKER_METRICS_PORT, contract.MPI_SSH_PORT}


def test_frontend_entrypoint_is_the_frontend_deployments_command():
    spec = spec_of("aggregated-small.yaml")
    dep = builders.frontend_deployment(owner("llama-8b"), spec)
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert exec_form("frontend", "ENTRYPOINT") == container["command"]
    cmd = exec_form("frontend", "CMD")
    assert cmd == ["--http-port", str(contract.FRONTEND_PORT)]
    assert exposed("frontend") == {contract.FRONTEND_PORT}


def test_operator_runs_the_operator_command_and_serves_liveness_on_all_interfaces():
    assert exec_form("operator", "ENTRYPOINT") == ["python", "-m", "tokenfab.cli"]
    cmd = exec_form("operator", "CMD")
    commands = {info.name or getattr(info.callback, "__name__", "") for info in app.registered_commands}
    assert cmd[0] in commands
    liveness = cmd[cmd.index("--liveness") + 1]
    assert liveness.startswith("http://0.0.0.0:")  # the kubelet probes the pod IP, not loopback
    port = int(liveness.split(":")[2].split("/")[0])
    assert exposed("operator") == {port}


def test_operator_works_with_a_read_only_root_filesystem():
    env = env_of("operator")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["HOME"] == "/tmp"
    assert last("operator", "WORKDIR") == "/tmp"
    words = [w for w, _ in instructions(dockerfile("operator"))]
    assert "VOLUME" not in words
    # Bytecode is compiled at build time, so nothing needs writing at run time.
    assert "compileall" in dockerfile("operator").read_text()


# -------------------------------------------------------------------------------------- dependencies


def pins(name: str) -> dict[str, str]:
    out = {}
    for line in (IMAGES / name / "requirements.txt").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        [spec] = list(req.specifier)
        assert spec.operator == "==", f"{name}: {line} is not pinned"
        out[canonicalize_name(req.name)] = spec.version
    return out


@pytest.mark.parametrize("name", ["frontend", "operator"])
def test_python_dependencies_are_pinned(name):
    assert pins(name)


def test_operator_pins_satisfy_every_project_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = pins("operator")
    for dep in project["dependencies"]:
        req = Requirement(dep)
        name = canonicalize_name(req.name)
        assert name in pinned, f"runtime-images/operator/requirements.txt misses {req.name}"
        assert SpecifierSet(str(req.specifier)).contains(pinned[name]), f"{name}=={pinned[name]} vs {dep}"
    python = bases("operator")[0].split(":")[1].split("-")[0]
    assert SpecifierSet(project["requires-python"]).contains(python)
