"""The worker launcher: launch plans, bad configurations and the process part.

Plans (pure) are checked for every kind of group (aggregated, prefill, decode, an 8-rank multi-node
group, MTP) and for every role of every example, from the very pods and engine ConfigMaps the builders
render: what the launcher runs must be what the reconciler meant. Bad configurations run
`python -m tokenfab.launcher --dry-run` as a subprocess and expect exit code 78 and a message naming the
problem. The process part runs the launcher with fake `python3`, `sshd` and `ssh-keygen` programs first
on PATH (shell scripts), on loopback ports only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import tokenfab.launcher
from testing.cases import DOMAIN, env, example_paths, load_example, owner, spec_of
from tokenfab.api.errors import parse_model_deployment
from tokenfab.api.models import ModelDeploymentSpec, RoleName
from tokenfab.fleet import facts
from tokenfab.launcher import fetch, manifest
from tokenfab.launcher import plan as lp
from tokenfab.launcher.run import LaunchError, Runner
from tokenfab.planning import builders, contract, weights_cache

RUN_DIR = "/tmp/tokenfab-mpi-test"


# ---------------------------------------------------------------------------------------------- helpers


def rendered(
    example: str, role: RoleName, patch: dict[str, Any] | None = None
) -> tuple[ModelDeploymentSpec, list[dict[str, Any]], str]:
    """(spec, pods of group slot 0, engine YAML of the role's ConfigMap) as the builders render them."""
    spec = spec_of(example, patch)
    name = load_example(example)["metadata"]["name"]
    own = owner(name)
    pods = builders.group_pods(
        own, spec, builders.GroupAt(role, 0, DOMAIN, builders.role_revision(spec, role))
    )
    engine_yaml = builders.engine_configmap(own, spec, role)["data"][contract.ENGINE_CONFIG_FILE]
    return spec, pods, engine_yaml


def pod_args(pod: dict[str, Any]) -> list[str]:
    args: list[str] = pod["spec"]["containers"][0]["args"]
    return args


def plan_of(pod: dict[str, Any], engine_yaml: str, *, as_root: bool = False) -> lp.LaunchPlan:
    environ = env(pod)
    identity = lp.read_identity(environ)
    return lp.plan_launch(
        identity, engine_yaml, pod_args(pod), environ=environ, run_dir=RUN_DIR, as_root=as_root
    )


def arg(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def dns_name(pod: dict[str, Any]) -> str:
    """The pod's DNS name as Kubernetes derives it: hostname.subdomain.namespace.svc.cluster.local."""
    s = pod["spec"]
    return f"{s['hostname']}.{s['subdomain']}.{pod['metadata']['namespace']}.svc.cluster.local"


def mount_path(pod: dict[str, Any], volume: str) -> str:
    [path] = [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume]
    return str(path)


def probe_port(pod: dict[str, Any]) -> int:
    container = pod["spec"]["containers"][0]
    port = container["readinessProbe"]["httpGet"]["port"]
    [number] = [p["containerPort"] for p in container["ports"] if p["name"] == port]
    return int(number)


# ------------------------------------------------------------------------------------------------ plans


def test_the_pods_run_the_launcher_module():
    _, [pod], _ = rendered("aggregated-small.yaml", "worker")
    assert pod["spec"]["containers"][0]["command"] == [contract.PYTHON, "-m", tokenfab.launcher.__name__]
    assert tokenfab.launcher.__name__ == contract.LAUNCHER_MODULE


def test_an_aggregated_one_pod_group_runs_the_dynamo_worker_directly():
    spec, [pod], engine_yaml = rendered("aggregated-small.yaml", "worker")
    plan = plan_of(pod, engine_yaml)
    assert plan.kind == "single"
    assert plan.command == (
        contract.PYTHON,
        "-m",
        contract.DYNAMO_WORKER_MODULE,
        *builders.worker_args(spec, "worker"),
    )
    assert "--disaggregation-mode" not in plan.command
    assert (plan.mode, plan.rank, plan.world_size, plan.gpus_per_pod) == (contract.MODE_AGGREGATED, 0, 1, 1)
    assert plan.engine.gpus == 1
    assert plan.engine.mtp_depth == 0
    # Nothing to prepare, nobody to wait for; Dynamo itself answers the probes (DYN_SYSTEM_PORT).
    assert (plan.run_dir, plan.copies, plan.files, plan.setup, plan.wait_for, plan.health) == (
        None,
        (),
        (),
        (),
        (),
        None,
    )
    assert plan.env == {}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_disaggregated_workers_get_their_mode(role):
    spec, pods, engine_yaml = rendered("qwen3-235b-autoscaled.yaml", role)
    plan = plan_of(pods[0], engine_yaml)
    assert plan.mode == role
    assert arg(plan.command, "--disaggregation-mode") == role
    assert plan.command[-len(builders.worker_args(spec, role)) :] == tuple(builders.worker_args(spec, role))
    # Qwen3 prefill is TP4 (one pod), decode TP8 (two pods: rank 0 under mpirun).
    assert plan.kind == ("single" if role == "prefill" else "leader")


def test_an_8_rank_group_runs_mpirun_on_rank_0_over_every_ranks_pod():
    spec, pods, engine_yaml = rendered("deepseek-r1-disaggregated.yaml", "decode")
    assert len(pods) == 8
    plans = [plan_of(p, engine_yaml) for p in pods]
    assert [p.kind for p in plans] == ["leader"] + ["follower"] * 7
    hosts = tuple(dns_name(p) for p in pods)
    assert all(p.hosts == hosts for p in plans)
    assert hosts[0] == env(pods[0])[contract.ENV_LEADER_ADDRESS]

    leader = plans[0]
    key = f"{RUN_DIR}/{lp.RUN_KEY}"
    forwarded = lp.forwarded_names(env(pods[0]))
    assert leader.command == (
        "mpirun",
        "-np",
        "32",
        "-H",
        ",".join(f"{h}:4" for h in hosts),
        "--map-by",
        "slot",
        "--bind-to",
        "none",
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "plm_rsh_args",
        f"-p {contract.MPI_SSH_PORT} -i {key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o BatchMode=yes -o LogLevel=ERROR",
        *[x for name in forwarded for x in ("-x", name)],
        "trtllm-llmapi-launch",
        contract.PYTHON,
        "-m",
        contract.DYNAMO_WORKER_MODULE,
        *builders.worker_args(spec, "decode"),
    )
    assert {"TOKENFAB_ROLE", "TOKENFAB_MODEL_PATH", "DYN_NAMESPACE", "NCCL_MNNVL_ENABLE"} <= set(forwarded)
    assert contract.ENV_RANK not in forwarded
    assert leader.env == {
        "OMPI_MCA_orte_keep_fqdn_hostnames": "1",
        "PRTE_MCA_prte_keep_fqdn_hostnames": "1",
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none",  # (no CMA without ptrace rights)
        "OMPI_MCA_smsc": "^cma",
        "PRTE_MCA_plm_ssh_args": f"-p {contract.MPI_SSH_PORT} -i {key} -o StrictHostKeyChecking=no "
        "-o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR",
    }
    assert leader.copies == (lp.Copy(f"{contract.MPI_SSH_DIR}/{contract.MPI_SSH_PRIVATE_KEY}", key),)
    assert leader.wait_for == tuple(lp.Endpoint(h, contract.MPI_SSH_PORT) for h in hosts[1:])
    assert leader.wait_seconds == lp.DEFAULT_PEER_WAIT_SECONDS
    assert leader.health is None  # the Dynamo worker on MPI rank 0 serves DYN_SYSTEM_PORT

    for rank, follower in enumerate(plans[1:], start=1):
        config = f"{RUN_DIR}/{lp.RUN_SSHD_CONFIG}"
        assert follower.rank == rank
        assert follower.command == ("sshd", "-D", "-e", "-f", config)
        assert follower.copies == (lp.Copy(f"{contract.MPI_SSH_DIR}/{contract.MPI_SSH_PRIVATE_KEY}", key),)
        assert follower.setup == (
            lp.Step(("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{RUN_DIR}/{lp.RUN_HOST_KEY}")),
            lp.Step(("ssh-keygen", "-y", "-f", key), stdout=f"{RUN_DIR}/{lp.RUN_AUTHORIZED_KEYS}"),
        )
        [(path, text)] = follower.files
        assert path == config
        assert f"Port {contract.MPI_SSH_PORT}\n" in text
        assert f"AuthorizedKeysFile {RUN_DIR}/{lp.RUN_AUTHORIZED_KEYS}\n" in text
        assert "PasswordAuthentication no\n" in text
        assert follower.health == lp.Endpoint("0.0.0.0", contract.WORKER_METRICS_PORT)
        assert follower.wait_for == ()


def test_mpirun_may_run_as_root_only_when_the_launcher_is_root():
    _, pods, engine_yaml = rendered("llama-405b-multinode-tp.yaml", "worker")
    assert "--allow-run-as-root" not in plan_of(pods[0], engine_yaml, as_root=False).command
    assert plan_of(pods[0], engine_yaml, as_root=True).command[:2] == ("mpirun", "--allow-run-as-root")


@pytest.mark.parametrize(("role", "kind"), [("prefill", "leader"), ("decode", "leader")])
def test_mtp_depth_reaches_the_engine_of_every_role(role, kind):
    spec, pods, engine_yaml = rendered("deepseek-r1-disaggregated.yaml", role)
    plan = plan_of(pods[0], engine_yaml)
    assert plan.kind == kind
    assert plan.engine.mtp_depth == spec.speculative_decoding.mtp_depth == 3
    assert plan.engine.enable_attention_dp is True


def test_mtp_on_a_one_pod_group_and_no_mtp_when_off():
    _, [pod], engine_yaml = rendered(
        "aggregated-small.yaml", "worker", {"speculativeDecoding": {"mtpDepth": 2}}
    )
    assert plan_of(pod, engine_yaml).engine.mtp_depth == 2
    _, pods, engine_yaml = rendered(
        "deepseek-r1-disaggregated.yaml", "decode", {"speculativeDecoding": {"mtpDepth": 0}}
    )
    assert plan_of(pods[0], engine_yaml).engine.mtp_depth == 0


def example_roles() -> list[tuple[str, RoleName]]:
    out = []
    for path in example_paths():
        spec = parse_model_deployment(load_example(path.name), path.name).spec
        out += [(path.name, role) for role, _ in spec.roles()]
    return out


@pytest.mark.parametrize(("example", "role"), example_roles())
def test_every_example_launches_what_the_builders_meant(example, role):
    spec, pods, engine_yaml = rendered(example, role)
    shape = builders.group_shape(spec, role)
    plans = [plan_of(pod, engine_yaml) for pod in pods]
    kinds = ["single"] if shape.nodes == 1 else ["leader"] + ["follower"] * (shape.nodes - 1)
    assert [p.kind for p in plans] == kinds
    assert [p.rank for p in plans] == list(range(shape.nodes))
    expected_args = tuple(builders.worker_args(spec, role))
    for pod, plan in zip(pods, plans, strict=True):
        e = env(pod)
        assert plan.dynamo_args == expected_args
        assert (
            arg(plan.dynamo_args, "--model-path") == e[contract.ENV_MODEL_PATH] == builders.model_path(spec)
        )
        assert arg(plan.dynamo_args, "--served-model-name") == e[contract.ENV_MODEL_NAME] == spec.model.name
        mode = arg(plan.dynamo_args, "--disaggregation-mode")
        assert (mode or contract.MODE_AGGREGATED) == e[contract.ENV_DISAGGREGATION_MODE] == plan.mode
        # The engine file Dynamo reads is the one the launcher checked: the mounted engine ConfigMap.
        engine_file = f"{mount_path(pod, 'engine')}/{contract.ENGINE_CONFIG_FILE}"
        assert arg(plan.dynamo_args, "--extra-engine-args") == e[contract.ENV_ENGINE_CONFIG] == engine_file
        assert plan.engine.gpus == shape.gpus == plan.world_size * plan.gpus_per_pod
        assert plan.hosts == tuple(dns_name(p) for p in pods)
        if plan.kind == "single":
            assert plan.command == lp.dynamo_command(expected_args)
        elif plan.kind == "leader":
            assert plan.command[-len(expected_args) - 4 :] == (
                lp.LLMAPI_LAUNCH,
                *lp.dynamo_command(expected_args),
            )
            assert arg(plan.command, "-np") == str(shape.gpus)
        else:
            # Followers answer the readiness probe themselves, on the port it probes.
            assert plan.health is not None
            assert plan.health.port == probe_port(pod)
        if shape.nodes > 1:
            assert e[contract.ENV_MPI_SSH_DIR] == mount_path(pod, "mpi-ssh") == contract.MPI_SSH_DIR
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            assert volumes["mpi-ssh"]["secret"]["secretName"] == contract.MPI_SSH_SECRET
        else:
            assert contract.ENV_MPI_SSH_DIR not in e


def test_forwarded_environment_leaves_out_per_host_values_and_mpis_own():
    environ = {
        "PATH": "/usr/bin",
        "HF_TOKEN": "secret",
        "HOSTNAME": "pod-0",
        contract.ENV_RANK: "0",
        "NVIDIA_VISIBLE_DEVICES": "GPU-1",
        "OMPI_MCA_btl": "tcp",
        "BAD-NAME": "x",
        contract.ENV_WORLD_SIZE: "2",
    }
    assert lp.forwarded_names(environ) == ("HF_TOKEN", "PATH", contract.ENV_WORLD_SIZE)


def test_dynamo_system_port_and_host_and_peer_wait_come_from_the_environment():
    _, pods, engine_yaml = rendered("llama-405b-multinode-tp.yaml", "worker")
    environ = {
        **env(pods[1]),
        contract.ENV_DYN_SYSTEM_HOST: "127.0.0.1",
        contract.ENV_DYN_SYSTEM_PORT: "19090",
    }
    plan = lp.plan_launch(
        lp.read_identity(environ),
        engine_yaml,
        pod_args(pods[1]),
        environ=environ,
        run_dir="/r",
        as_root=False,
    )
    assert plan.health == lp.Endpoint("127.0.0.1", 19090)
    environ = {**env(pods[0]), contract.ENV_PEER_WAIT_SECONDS: "5"}
    plan = lp.plan_launch(
        lp.read_identity(environ),
        engine_yaml,
        pod_args(pods[0]),
        environ=environ,
        run_dir="/r",
        as_root=False,
    )
    assert plan.wait_seconds == 5


# ---------------------------------------------------------------------------------- bad configurations


def multi_node_env() -> tuple[dict[str, str], str, list[str]]:
    _, pods, engine_yaml = rendered("deepseek-r1-disaggregated.yaml", "decode")
    return env(pods[3]), engine_yaml, pod_args(pods[3])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({contract.ENV_RANK: None}, f"{contract.ENV_RANK} is not set"),
        ({contract.ENV_GROUP: "", contract.ENV_NAMESPACE: None}, f"{contract.ENV_GROUP} is not set"),
        ({contract.ENV_RANK: "three"}, f"{contract.ENV_RANK}='three' is not an integer"),
        ({contract.ENV_WORLD_SIZE: "0"}, f"{contract.ENV_WORLD_SIZE}=0 must be at least 1"),
        ({contract.ENV_RANK: "8"}, f"{contract.ENV_RANK}=8 is not below {contract.ENV_WORLD_SIZE}=8"),
        ({contract.ENV_ROLE: "router"}, f"{contract.ENV_ROLE}='router' is not a role"),
        (
            {contract.ENV_DISAGGREGATION_MODE: "both"},
            f"{contract.ENV_DISAGGREGATION_MODE}='both' is not a mode",
        ),
        ({contract.ENV_DISAGGREGATION_MODE: "prefill"}, "does not fit TOKENFAB_ROLE='decode'"),
        ({contract.ENV_MPI_SSH_DIR: None}, f"Secret {contract.MPI_SSH_SECRET}"),
        ({contract.ENV_LEADER_ADDRESS: "elsewhere"}, "is not rank 0's address"),
        ({contract.ENV_DYN_SYSTEM_PORT: "70000"}, "is not a TCP port"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_identity_problems_name_the_variable(change, message):
    environ, _, _ = multi_node_env()
    for name, value in change.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    with pytest.raises(lp.ConfigError) as err:
        lp.read_identity(environ)
    assert any(message in p for p in err.value.problems), err.value.problems


def test_every_missing_variable_is_reported_at_once():
    with pytest.raises(lp.ConfigError) as err:
        lp.read_identity({})
    assert len(err.value.problems) == len(lp.REQUIRED)


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ("tensor_parallel_size: [1", "is not valid YAML"),
        ("- 1\n- 2\n", "must be a mapping of TensorRT-LLM LLM-API keys, got list"),
        ("pipeline_parallel_size: 1\n", "tensor_parallel_size is missing"),
        ("tensor_parallel_size: true\n", "tensor_parallel_size must be a positive integer, got True"),
        (
            "tensor_parallel_size: 16\npipeline_parallel_size: 1\n",
            "tensor_parallel_size x pipeline_parallel_size = 16 x 1 = 16 GPUs, but the group has "
            "TOKENFAB_WORLD_SIZE x TOKENFAB_GPUS_PER_POD = 8 x 4 = 32 GPUs",
        ),
        (
            "tensor_parallel_size: 16\ncontext_parallel_size: 4\n",
            "x context_parallel_size = 16 x 1 x 4 = 64 GPUs",
        ),
        (
            "tensor_parallel_size: 32\n"
            "speculative_config: {decoding_type: MTP, num_nextn_predict_layers: 0}\n",
            "speculative_config: num_nextn_predict_layers must be a positive integer, got 0",
        ),
    ],
    ids=["yaml", "list", "no-tp", "bool-tp", "tp-x-pp", "cp", "mtp"],
)
def test_engine_problems_name_the_key(engine, message):
    environ, _, args = multi_node_env()
    identity = lp.read_identity(environ)
    with pytest.raises(lp.ConfigError) as err:
        lp.plan_launch(identity, engine, args, environ=environ, run_dir=RUN_DIR, as_root=False)
    assert any(message in p for p in err.value.problems), err.value.problems
    assert any(contract.ENV_ENGINE_CONFIG in p for p in err.value.problems)


def launcher(args: list[str], environ: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokenfab.launcher", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kwargs,
    )


def base_environ() -> dict[str, str]:
    """What a subprocess needs besides the pod's variables (no PYTHONPATH games: tokenfab is installed)."""
    keep = ("PATH", "HOME", "LANG", "VIRTUAL_ENV", "PYTHONPATH")
    return {k: os.environ[k] for k in keep if k in os.environ}


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing-var", "TOKENFAB_GPUS_PER_POD is not set"),
        ("rank-too-high", "TOKENFAB_RANK=9 is not below TOKENFAB_WORLD_SIZE=8"),
        ("unreadable-engine", "cannot be read"),
        ("invalid-engine", "is not valid YAML"),
        ("engine-disagrees", "= 16 GPUs, but the group has TOKENFAB_WORLD_SIZE x TOKENFAB_GPUS_PER_POD"),
        ("no-args", "no arguments for `python3 -m dynamo.trtllm`"),
    ],
)
def test_a_bad_configuration_exits_non_zero_naming_the_problem(tmp_path, case, message):
    environ, engine_yaml, args = multi_node_env()
    engine = tmp_path / "engine.yaml"
    engine.write_text(engine_yaml)
    environ = {**base_environ(), **environ, contract.ENV_ENGINE_CONFIG: str(engine)}
    if case == "missing-var":
        del environ[contract.ENV_GPUS_PER_POD]
    elif case == "rank-too-high":
        environ[contract.ENV_RANK] = "9"
    elif case == "unreadable-engine":
        environ[contract.ENV_ENGINE_CONFIG] = str(tmp_path / "missing.yaml")
    elif case == "invalid-engine":
        engine.write_text("tensor_parallel_size: 32\n  bad indent: [\n")
    elif case == "engine-disagrees":
        engine.write_text(engine_yaml.replace("tensor_parallel_size: 32", "tensor_parallel_size: 16"))
    elif case == "no-args":
        args = []
    done = launcher(["--dry-run", *args], environ)
    assert done.returncode == lp.EXIT_CONFIG, done.stderr
    assert "tokenfab-launcher: bad configuration:" in done.stderr
    assert message in done.stderr, done.stderr
    assert done.stdout == ""


def test_dry_run_prints_the_plan_as_json(tmp_path):
    _, [pod], engine_yaml = rendered("aggregated-small.yaml", "worker")
    engine = tmp_path / "engine.yaml"
    engine.write_text(engine_yaml)
    environ = {**base_environ(), **env(pod), contract.ENV_ENGINE_CONFIG: str(engine)}
    done = launcher(["--dry-run", "--", *pod_args(pod)], environ)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["kind"] == "single"
    assert out["command"] == [contract.PYTHON, "-m", contract.DYNAMO_WORKER_MODULE, *pod_args(pod)]
    assert out["engine"]["tensor_parallel_size"] == 1


def test_help_exits_zero():
    done = launcher(["--help"], base_environ())
    assert done.returncode == 0
    assert "--dry-run" in done.stdout


# --------------------------------------------------------------------------------------- process part


def fake_program(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# A long-running stand-in: on SIGTERM it records it and exits with 42. Its arguments file appears (whole,
# by rename) only once the trap is set, so a test that saw the file may send SIGTERM.
LONG_RUNNING = """trap 'echo TERM > "$FAKE_DIR/$(basename "$0").term"; exit 42' TERM
echo "$@" > "$FAKE_DIR/$(basename "$0").args.tmp"
mv "$FAKE_DIR/$(basename "$0").args.tmp" "$FAKE_DIR/$(basename "$0").args"
while :; do sleep 0.05; done
"""


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def fakes(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return bin_dir


def start_launcher(args: list[str], environ: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tokenfab.launcher", *args],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(cache: Path, repo: str, commit: str = COMMIT, branch: str = "main") -> Path:
    """A Hugging Face hub cache holding one snapshot of `repo` (what a node's model cache holds after a
    first download): its directory."""
    base = cache / f"models--{repo.replace('/', '--')}"
    snapshot = base / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}\n")
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / branch).write_text(commit)
    return snapshot


def offline_cache(tmp_path: Path, pod: dict[str, Any]) -> dict[str, str]:
    """The pod's hf:// weights already in its model cache; no hub reachable (HF_HUB_OFFLINE). A pod
    without a model cache (pvc:// weights, mounted) gets none."""
    if contract.ENV_MODEL_CACHE not in env(pod):
        return {"HF_HUB_OFFLINE": "1"}
    cache = tmp_path / "model-cache"
    fake_hub_cache(cache, env(pod)[contract.ENV_MODEL_PATH])
    return {contract.ENV_MODEL_CACHE: str(cache), "HF_HUB_OFFLINE": "1"}


def with_snapshot(args: list[str], tmp_path: Path, repo: str) -> list[str]:
    out = list(args)
    out[out.index("--model-path") + 1] = str(
        tmp_path / "model-cache" / f"models--{repo.replace('/', '--')}" / "snapshots" / COMMIT
    )
    return out


def single_pod_environ(tmp_path: Path, bin_dir: Path) -> tuple[dict[str, str], list[str]]:
    _, [pod], engine_yaml = rendered("aggregated-small.yaml", "worker")
    engine = tmp_path / "engine.yaml"
    engine.write_text(engine_yaml)
    environ = {
        **base_environ(),
        **env(pod),
        **offline_cache(tmp_path, pod),
        contract.ENV_ENGINE_CONFIG: str(engine),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "TMPDIR": str(tmp_path),
    }
    return environ, pod_args(pod)


def test_sigterm_is_forwarded_to_the_worker_and_its_exit_code_propagates(tmp_path, fakes):
    fake_program(fakes, "python3", LONG_RUNNING)
    environ, args = single_pod_environ(tmp_path, fakes)
    proc = start_launcher(args, environ)
    try:
        wait_for(lambda: (tmp_path / "python3.args").exists())
        # the engine loads the snapshot the launcher found in the model cache
        repo = environ[contract.ENV_MODEL_PATH]
        want = ["-m", contract.DYNAMO_WORKER_MODULE, *with_snapshot(args, tmp_path, repo)]
        assert (tmp_path / "python3.args").read_text().split() == want
        os.kill(proc.pid, signal.SIGTERM)  # the launcher only: it must forward to the worker
        proc.wait(timeout=30)
    finally:
        stop(proc)
    assert (tmp_path / "python3.term").read_text() == "TERM\n"
    assert proc.returncode == 42


@pytest.mark.parametrize(("body", "code"), [("exit 3\n", 3), ("kill -KILL $$\n", 128 + 9)])
def test_the_workers_exit_code_is_the_launchers(tmp_path, fakes, body, code):
    fake_program(fakes, "python3", body)
    environ, args = single_pod_environ(tmp_path, fakes)
    done = launcher(args, environ)
    assert done.returncode == code, done.stderr
    assert f"exited with code {code}" in done.stderr


def test_hf_weights_at_the_pinned_revision_are_what_the_engine_loads(tmp_path, fakes):
    """model.revision (TOKENFAB_MODEL_REVISION) picks the snapshot: the pinned commit's, not main's."""
    fake_program(fakes, "python3", 'echo "$@" > "$FAKE_DIR/python3.args"\n')
    environ, args = single_pod_environ(tmp_path, fakes)
    repo = environ[contract.ENV_MODEL_PATH]
    pinned = "fedcba9876543210fedcba9876543210fedcba98"
    snapshot = fake_hub_cache(tmp_path / "model-cache", repo, commit=pinned, branch="release")
    environ[contract.ENV_MODEL_REVISION] = pinned
    done = launcher(args, environ)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "python3.args").read_text().split()
    assert argv[argv.index("--model-path") + 1] == str(snapshot)
    assert f"weights hf://{repo}@{pinned}: {snapshot} (from the model cache, HF_HUB_OFFLINE" in done.stderr


def hub_down(environ: dict[str, str]) -> dict[str, str]:
    """Online, but the hub refuses every connection (a closed loopback port)."""
    out = {k: v for k, v in environ.items() if k != "HF_HUB_OFFLINE"}
    return {
        **out,
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "HF_HUB_ETAG_TIMEOUT": "2",
        "HF_HUB_DOWNLOAD_TIMEOUT": "2",
    }


def test_a_complete_pinned_snapshot_is_loaded_without_asking_the_hub(tmp_path, fakes):
    fake_program(fakes, "python3", 'echo "$@" > "$FAKE_DIR/python3.args"\n')
    environ, args = single_pod_environ(tmp_path, fakes)
    repo = environ[contract.ENV_MODEL_PATH]
    snapshot = with_snapshot(args, tmp_path, repo)[args.index("--model-path") + 1]
    manifest.write(Path(snapshot), COMMIT)
    environ = hub_down({**environ, contract.ENV_MODEL_REVISION: COMMIT})
    done = launcher(args, environ)
    assert done.returncode == 0, done.stderr
    assert f"{snapshot} (complete in the model cache, " in done.stderr
    assert "as its manifest says)" in done.stderr
    full = launcher(args, {**environ, "TOKENFAB_VERIFY_WEIGHTS": "full"})
    assert "as its manifest says and SHA-256)" in full.stderr
    # A file of it damaged since: not loaded from the cache unchecked; the hub is asked (down here: the
    # snapshot is used, said to be unverified).
    victim = next(p for p in sorted(Path(snapshot).rglob("*")) if p.is_file() and p.name != manifest.MANIFEST)
    victim.write_bytes(victim.read_bytes() + b"x")
    damaged = launcher(args, environ)
    assert "is not verified" in damaged.stderr
    assert f"{victim.relative_to(snapshot)} has" in damaged.stderr
    assert "complete in the model cache" not in damaged.stderr


def test_an_unverified_snapshot_is_completed_from_the_hub_or_used_with_a_warning(tmp_path, fakes):
    """A branch (it may have moved) or a snapshot no completed download marked: the hub is asked; when it
    does not answer, the cached snapshot is used, and the log says it may be incomplete."""
    fake_program(fakes, "python3", 'echo "$@" > "$FAKE_DIR/python3.args"\n')
    environ, args = single_pod_environ(tmp_path, fakes)
    done = launcher(args, hub_down(environ))  # revision unset: main
    assert done.returncode == 0, done.stderr
    assert "the hub did not answer" in done.stderr
    assert "may be incomplete or behind the branch" in done.stderr


def test_hf_weights_that_cannot_be_fetched_stop_the_pod_with_the_reason(tmp_path, fakes):
    fake_program(fakes, "python3", "exit 0\n")
    environ, args = single_pod_environ(tmp_path, fakes)
    environ[contract.ENV_MODEL_REVISION] = "not-a-revision-in-the-cache"
    done = launcher(args, hub_down(environ))
    assert done.returncode == 1
    assert "could not be fetched" in done.stderr
    assert not (tmp_path / "python3.args").exists(), "the engine never started"
    offline = launcher(args, environ)
    assert offline.returncode == 1
    assert "are not in the model cache" in offline.stderr


def fetch_only_environ(tmp_path: Path, source: str = "hf://org/model", revision: str = "") -> dict[str, str]:
    """What a weights-fetch pod carries (tokenfab.planning.builders.weights_fetch_pod)."""
    return {
        **base_environ(),
        contract.ENV_MODEL_SOURCE: source,
        contract.ENV_MODEL_REVISION: revision,
        contract.ENV_MODEL_CACHE: str(tmp_path / "model-cache"),
        fetch.ENV_TERMINATION_LOG: str(tmp_path / "termination-log"),
    }


def test_fetch_only_stages_verified_weights_and_exits_0(tmp_path):
    snapshot = fake_hub_cache(tmp_path / "model-cache", "org/model")
    manifest.write(snapshot, COMMIT)  # as a completed download leaves it
    done = launcher(["--fetch-only"], hub_down(fetch_only_environ(tmp_path, revision=COMMIT)))
    assert done.returncode == 0, done.stderr
    assert f"weights hf://org/model@{COMMIT}: {snapshot} (complete in the model cache, " in done.stderr
    *_, staged, result = done.stderr.rstrip().splitlines()
    assert staged.endswith("staged")
    # the line the operator reads from the pod's log (tokenfab.planning.launcher_log)
    said = '{"bytes": 3, "files": 1, "seconds": 0.0, "source": "cache"}'
    assert result == f"tokenfab-launcher: weights-result {said}"
    assert not (tmp_path / "python3.args").exists()  # (nothing else runs)
    # its termination message: what the operator puts in status.weightsCache.staged
    said = json.loads((tmp_path / "termination-log").read_text())
    files = [p for p in snapshot.rglob("*") if p.is_file() and not p.name.startswith(".tokenfab")]
    assert said == {
        "source": "cache",
        "bytes": sum(p.stat().st_size for p in files),
        "files": len(files),
        "seconds": said["seconds"],
    }
    assert said["bytes"] > 0


def test_the_fetch_pods_termination_message_reaches_status_whole(tmp_path):
    """Launcher -> kubelet's termination message -> the operator's pod facts -> status.weightsCache."""
    snapshot = fake_hub_cache(tmp_path / "model-cache", "org/model")
    manifest.write(snapshot, COMMIT)
    assert launcher(["--fetch-only"], hub_down(fetch_only_environ(tmp_path, revision=COMMIT))).returncode == 0
    message = (tmp_path / "termination-log").read_text()
    terminated = {"exitCode": 0, "reason": "Completed", "message": message}
    said = facts._exit_message({}, {"containerStatuses": [{"state": {"terminated": terminated}}]})
    got = weights_cache.staged_result(weights_cache.FetchPod("p", "node-1", "Succeeded", "k", result=said))
    assert got is not None
    assert (got.node, got.source, got.bytes) == ("node-1", "cache", json.loads(message)["bytes"])
    for broken in ("exit code 0, Completed", "exit code 0, Completed, {not json", "x, [1]", '{"bytes": -1}'):
        assert (
            weights_cache.staged_result(weights_cache.FetchPod("p", "n", "Succeeded", "k", result=broken))
            is None
        )


def test_fetch_only_fails_with_the_reason_when_the_weights_cannot_be_had(tmp_path):
    done = launcher(["--fetch-only"], hub_down(fetch_only_environ(tmp_path)))
    assert done.returncode == 1
    assert "weights hf://org/model@main could not be fetched" in done.stderr
    # a snapshot with no manifest, and a hub that does not answer: not staged (it may be incomplete)
    fake_hub_cache(tmp_path / "model-cache", "org/model")
    unverified = launcher(["--fetch-only"], hub_down(fetch_only_environ(tmp_path)))
    assert unverified.returncode == 1
    assert "is not verified (no manifest of a completed download): not staged" in unverified.stderr
    # a pod without a model cache has nothing to stage into
    bare = {k: v for k, v in fetch_only_environ(tmp_path).items() if k != contract.ENV_MODEL_CACHE}
    nothing = launcher(["--fetch-only"], bare)
    assert nothing.returncode == 78
    assert "nothing to fetch" in nothing.stderr


@pytest.mark.parametrize(
    ("revision", "cached", "complete", "offline", "source"),
    [
        (COMMIT, True, True, False, "cache"),  # pinned, and a finished download of it: never changes
        (COMMIT, True, False, False, "download"),  # an interrupted download: complete it
        ("main", True, True, False, "download"),  # a branch may have moved
        (None, True, True, False, "download"),
        (COMMIT, False, False, False, "download"),
        (COMMIT, True, True, True, "offline"),
        (None, False, False, True, "offline"),
    ],
)
def test_where_hf_weights_come_from(revision, cached, complete, offline, source):
    assert lp.weights_source(revision, cached, complete, offline) == source


def test_pvc_weights_need_no_fetch():
    spec = spec_of("qwen3-235b-autoscaled.yaml")
    pod = builders.group_pods(owner("q"), spec, builders.GroupAt("prefill", 0, DOMAIN, "rev"))[0]
    environ = {**env(pod), contract.ENV_ENGINE_CONFIG: "/e"}
    identity = lp.read_identity(environ)
    assert lp.fetch_of(identity) is None
    hf = lp.read_identity(
        {**environ, contract.ENV_MODEL_SOURCE: "hf://org/m", contract.ENV_MODEL_REVISION: "v2"}
    )
    assert lp.fetch_of(hf) == lp.Fetch("org/m", "v2", contract.MODEL_CACHE_DIR)


def test_a_missing_program_exits_127_with_a_message(tmp_path, fakes):
    environ, args = single_pod_environ(tmp_path, fakes)
    environ["PATH"] = str(fakes)  # no python3 at all
    done = launcher(args, environ)
    assert done.returncode == 127
    assert "python3 is not on PATH" in done.stderr


def follower_environ(tmp_path: Path, bin_dir: Path, port: int) -> tuple[dict[str, str], list[str]]:
    _, pods, engine_yaml = rendered("llama-405b-multinode-tp.yaml", "worker")
    engine = tmp_path / "engine.yaml"
    engine.write_text(engine_yaml)
    ssh_dir = tmp_path / "mpi-ssh"
    ssh_dir.mkdir()
    (ssh_dir / contract.MPI_SSH_PRIVATE_KEY).write_text("private\n")
    environ = {
        **base_environ(),
        **env(pods[2]),
        **offline_cache(tmp_path, pods[2]),
        contract.ENV_ENGINE_CONFIG: str(engine),
        contract.ENV_MPI_SSH_DIR: str(ssh_dir),
        contract.ENV_DYN_SYSTEM_HOST: "127.0.0.1",
        contract.ENV_DYN_SYSTEM_PORT: str(port),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DIR": str(tmp_path),
        "TMPDIR": str(tmp_path),
    }
    return environ, pod_args(pods[2])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_follower_runs_sshd_and_answers_health_and_metrics_on_its_port(tmp_path, fakes):
    fake_program(fakes, "sshd", LONG_RUNNING)
    # ssh-keygen stand-in: -y prints a public key; otherwise writes the key file named by -f.
    fake_program(
        fakes,
        "ssh-keygen",
        'if [ "$1" = "-y" ]; then echo "ssh-ed25519 AAAA derived from $(cat "$3")"; exit 0; fi\n'
        'while [ "$1" != "-f" ]; do shift; done; echo key > "$2"\n',
    )
    port = free_port()
    environ, args = follower_environ(tmp_path, fakes, port)
    proc = start_launcher(args, environ)
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            try:
                return get(base + contract.HEALTH_PATH)[0] == 200
            except OSError:
                return False

        wait_for(healthy)
        wait_for((tmp_path / "sshd.args").exists)
        status, body = get(base + contract.HEALTH_PATH)
        assert json.loads(body) == {"status": "ready", "rank": 2}
        status, metrics = get(base + contract.METRICS_PATH)
        assert status == 200
        assert "tokenfab_launcher_child_up 1" in metrics
        assert 'rank="2",world_size="4",kind="follower"' in metrics
        assert get(base + "/nope")[0] == 404

        [run_dir] = tmp_path.glob("tokenfab-mpi-*")
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        keys = run_dir / lp.RUN_AUTHORIZED_KEYS
        assert keys.read_text() == "ssh-ed25519 AAAA derived from private\n"
        key = run_dir / lp.RUN_KEY
        assert key.read_text() == "private\n"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert stat.S_IMODE(keys.stat().st_mode) == 0o600
        assert (run_dir / lp.RUN_HOST_KEY).read_text() == "key\n"
        assert f"Port {contract.MPI_SSH_PORT}" in (run_dir / lp.RUN_SSHD_CONFIG).read_text()
        # sshd is started by absolute path (it re-executes itself), with the written config.
        assert (tmp_path / "sshd.args").read_text().split() == [
            "-D",
            "-e",
            "-f",
            str(run_dir / "sshd_config"),
        ]

        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        stop(proc)
    assert (tmp_path / "sshd.term").exists()
    assert proc.returncode == 42


def test_a_follower_without_the_ssh_key_secret_says_so(tmp_path, fakes):
    environ, args = follower_environ(tmp_path, fakes, free_port())
    (Path(environ[contract.ENV_MPI_SSH_DIR]) / contract.MPI_SSH_PRIVATE_KEY).unlink()
    done = launcher(args, environ)
    assert done.returncode == lp.EXIT_CONFIG
    assert f"Secret {contract.MPI_SSH_SECRET}" in done.stderr


def leader_plan(tmp_path: Path) -> lp.LaunchPlan:
    _, pods, engine_yaml = rendered("llama-405b-multinode-tp.yaml", "worker")
    ssh_dir = tmp_path / "mpi-ssh"
    ssh_dir.mkdir()
    (ssh_dir / contract.MPI_SSH_PRIVATE_KEY).write_text("private\n")
    environ = {**env(pods[0]), contract.ENV_MPI_SSH_DIR: str(ssh_dir)}
    return lp.plan_launch(
        lp.read_identity(environ),
        engine_yaml,
        pod_args(pods[0]),
        environ=environ,
        run_dir=str(tmp_path / "run"),
        as_root=False,
    )


def test_the_leader_copies_the_private_key_privately(tmp_path):
    plan = leader_plan(tmp_path)
    Runner(plan, {}).prepare()
    key = tmp_path / "run" / lp.RUN_KEY
    assert key.read_text() == "private\n"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o700


def test_the_leader_waits_for_every_rank_to_accept_connections(tmp_path):
    # The ranks' DNS names are replaced by loopback listeners: one open now, one never.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        open_port = listener.getsockname()[1]
        plan = replace(leader_plan(tmp_path), wait_for=(lp.Endpoint("127.0.0.1", open_port),), wait_seconds=5)
        Runner(plan, {}).wait_for_peers()  # returns at once
        closed = lp.Endpoint("127.0.0.1", free_port())
        plan = replace(plan, wait_for=(lp.Endpoint("127.0.0.1", open_port), closed), wait_seconds=1)
        with pytest.raises(LaunchError) as err:
            Runner(plan, {}).wait_for_peers()
    assert f"gave up after 1 s waiting for 127.0.0.1:{closed.port}" in str(err.value)
    assert contract.ENV_PEER_WAIT_SECONDS in str(err.value)


def test_engine_yaml_of_every_example_is_what_the_launcher_reads():
    # The ConfigMap key the builders write is the file name the pods point the launcher at.
    for path in example_paths():
        spec = parse_model_deployment(load_example(path.name), path.name).spec
        for role, _ in spec.roles():
            _, pods, engine_yaml = rendered(path.name, role)
            assert env(pods[0])[contract.ENV_ENGINE_CONFIG].endswith("/" + contract.ENGINE_CONFIG_FILE)
            assert isinstance(yaml.safe_load(engine_yaml), dict)


def test_a_manifest_names_every_file_with_its_size_and_sha256_and_finds_any_change(tmp_path):
    snap = tmp_path / "snapshots" / COMMIT
    (snap / "sub").mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / "sub" / "model-00001.safetensors").write_bytes(b"\0" * 3000)
    doc = manifest.write(snap, COMMIT)
    assert doc["commit"] == COMMIT
    assert doc["files"]["sub/model-00001.safetensors"]["size"] == 3000
    assert doc["files"]["config.json"]["sha256"] == manifest.sha256(snap / "config.json")
    assert manifest.verify(snap).ok
    assert manifest.verify(snap, full=True).ok
    # Same size, other bytes: only the full check sees it.
    (snap / "config.json").write_text("[]")
    assert manifest.verify(snap).ok
    bad = manifest.verify(snap, full=True)
    assert not bad.ok
    assert "config.json does not match its SHA-256" in bad.words()
    (snap / "sub" / "model-00001.safetensors").unlink()
    assert "sub/model-00001.safetensors is missing" in manifest.verify(snap).words()
    (snap / manifest.MANIFEST).unlink()
    assert not manifest.verify(snap).ok  # (no manifest: no completed download)


def test_a_manifest_another_pod_is_writing_is_no_file_of_the_snapshot(tmp_path):
    """Pods of several deployments share a node's model cache: one's manifest, mid-write, is not hashed
    into another's, and a finished manifest is readable by every pod (not only its writer's user)."""
    snap = tmp_path / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (snap / f"{manifest.MANIFEST}.other-pod.tmp").write_text("half a manifest")
    doc = manifest.write(snap, COMMIT)
    assert set(doc["files"]) == {"config.json"}
    assert (snap / manifest.MANIFEST).stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in snap.iterdir()) == sorted(
        ["config.json", manifest.MANIFEST, f"{manifest.MANIFEST}.other-pod.tmp"]
    )  # (its own temporary file is gone)


# ------------------------------------------------------------------------------ the weights init container


@pytest.mark.parametrize(
    ("example", "patch"),
    [
        ("deepseek-r1-disaggregated.yaml", None),  # hf://, a per-pod cache
        ("aggregated-small.yaml", {"model": {"cache": {"storageClassName": "local-nvme"}}}),  # a node's claim
        ("aggregated-small.yaml", {"model": {"source": "s3://weights/llama", "revision": None}}),
        ("llama-405b-multinode-tp.yaml", {"model": {"cache": {"storageClassName": "local-nvme"}}}),  # pvc://
        ("llama-405b-multinode-tp.yaml", None),  # pvc:// mounted: nothing to fetch
    ],
)
def test_a_worker_pods_init_container_fetches_what_its_launcher_would_then_find_in_the_same_cache(
    example: str, patch: dict[str, Any] | None
) -> None:
    """The weights init container runs `launcher --fetch-only` with what it reads (fetch_of_env) naming
    the weights and the cache the worker's own launcher plans to fetch, mounted at the same path from the
    same volume: the worker then finds them there, and its startup probe counts only its start."""
    spec, pods, engine_yaml = rendered(example, spec_of(example).roles()[0][0], patch)
    for pod in pods:
        planned = plan_of(pod, engine_yaml).fetch
        inits = pod["spec"].get("initContainers") or []
        if planned is None:
            assert inits == []
            continue
        [init] = inits
        assert init["name"] == contract.WEIGHTS_INIT_CONTAINER
        assert init["command"] == [contract.PYTHON, "-m", contract.LAUNCHER_MODULE, "--fetch-only"]
        got = fetch.fetch_of_env({e["name"]: e["value"] for e in init["env"] if "value" in e})
        assert got is not None
        assert (got.repo, got.revision, got.cache_dir, got.scheme) == (
            planned.repo,
            planned.revision,
            planned.cache_dir,
            planned.scheme,
        )
        worker_mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        for m in init["volumeMounts"]:
            assert worker_mounts[m["name"]] == m["mountPath"]
        assert worker_mounts["model-cache"] == planned.cache_dir
        assert spec.topology.gpu_resource not in str(init["resources"])  # (a download needs no GPU)
