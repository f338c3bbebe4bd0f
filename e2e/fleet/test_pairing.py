"""The pairing reads (e2e/fleet/pairing.py) on lines as Dynamo 1.6.1 writes them (colours included)."""

from __future__ import annotations

from pathlib import Path

from e2e.fleet import pairing

C = "\x1b[2m"
R = "\x1b[0m"
FRONTEND = (
    f"{C}2026-12-07T12:45:48.258483Z{R} \x1b[32m INFO{R} \x1b[1mhttp-request{R}: "
    f"{C}dynamo_llm::http::service::metrics{R}{C}:{R} request completed "
    f"\x1b[3mrequest_id{R}{C}={R}b6b96d61-fbe0-46fd-acee-2564a75c2f8c "
    "model=tokenfab/tiny-llama endpoint=chat_completions request_type=stream status=success elapsed_ms=198 "
    'method=POST uri=/v1/chat/completions request_id=87935d8d-1c9b-4fc2-81aa-e512c51e6182 model="x" '
    'ttft_ms="130.00" prefill_worker_id=8691584500407949 decode_worker_id=1976426862401030 '
    'request.outcome="success"'
)
JOINED = (
    f"{C}2026-12-07T12:45:39.612561Z{R} \x1b[32m INFO{R} {C}dynamo_runtime::discovery::kube{R}{C}:{R} "
    'Initializing KubeDiscoveryClient: mode=Pod, target=Pod("tiny-decode-0-0"), cr_name=tiny-decode-0-0, '
    "instance_id=7058cbd0ed606, namespace=live-x, pod_uid=23cb95ea"
)


def test_the_frontends_pairs_and_the_workers_ids_are_read_from_their_logs(tmp_path: Path) -> None:
    pairs = pairing.frontend_pairs("noise\n" + FRONTEND + "\nrequest completed request_id=x status=error\n")
    assert pairs == {"b6b96d61-fbe0-46fd-acee-2564a75c2f8c": (8691584500407949, 1976426862401030)}
    (tmp_path / "live-x_tiny-decode-0-0.log").write_text(JOINED + "\n")
    (tmp_path / "live-y_other-decode-0-0.log").write_text(JOINED.replace("live-x", "live-y") + "\n")
    assert pairing.instance_ids(tmp_path, "live-x") == {0x7058CBD0ED606: "tiny-decode-0-0"}


def test_a_tally_counts_transfers_by_unit_and_domain_and_checks_the_frontend_saw_the_same():
    pods = {1: "m-prefill-0-0", 2: "m-decode-0-0", 3: "m-prefill-1-0", 4: "m-decode-1-0"}
    unit = {"m-prefill-0-0": "0", "m-decode-0-0": "0", "m-prefill-1-0": "1", "m-decode-1-0": "1"}
    domain = {"m-prefill-0-0": "r0", "m-decode-0-0": "r0", "m-prefill-1-0": "r0", "m-decode-1-0": "r1"}
    client = {"a": (1, 2), "b": (3, 4), "c": (1, 4), "d": (9, 2)}
    t = pairing.tally(client, {**client, "warmup": (1, 2)}, pods, unit, domain)
    assert (t.transfers, t.in_unit, t.in_domain, t.unknown, t.frontend, t.agree) == (4, 2, 1, 1, 4, True)
    assert t.by_pair == {
        "m-prefill-0-0 -> m-decode-0-0": 1,
        "m-prefill-0-0 -> m-decode-1-0": 1,
        "m-prefill-1-0 -> m-decode-1-0": 1,
    }
    missed = pairing.tally(client, {"a": (1, 2), "b": (3, 2)}, pods, unit, domain)
    assert (missed.frontend, missed.agree) == (2, False)
