"""`tokenfab doctor`'s table of what the operator does stays what the chart grants, and its exit codes."""

from __future__ import annotations

from testing.chart import CLUSTER_RULES, NAMESPACED_RULES, merged
from tokenfab import doctor
from tokenfab.api import crd
from tokenfab.planning import builders, contract


def test_the_access_doctor_checks_is_exactly_what_the_chart_grants():
    checked = {key: set(verbs) for key, (verbs, _ns) in doctor.OPERATOR_RULES.items()}
    assert checked == merged(CLUSTER_RULES, NAMESPACED_RULES)
    for key, (_verbs, namespaced) in doctor.OPERATOR_RULES.items():
        assert namespaced == (key in NAMESPACED_RULES), key


def test_the_operator_holds_what_it_grants_the_pods():
    """RBAC refuses a Role that grants more than its creator holds."""
    for rule in builders.DISCOVERY_RULES:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert set(rule["verbs"]) <= set(doctor.OPERATOR_RULES[(group, resource)][0]), (
                    group,
                    resource,
                )


def test_the_dynamo_crd_names_the_builders_use_are_the_crds():
    assert f"{crd.DYNAMO_GROUP}/{crd.DYNAMO_VERSION}" == contract.DYNAMO_METADATA_API
    assert contract.DYNAMO_METADATA_KIND == crd.DYNAMO_METADATA_KIND
    assert contract.DYNAMO_METADATA_PLURAL == crd.DYNAMO_METADATA_PLURAL


def test_exit_codes_are_for_scripts():
    ok = doctor.Check("a", "pass", "fine")
    warn = doctor.Check("b", "warn", "maybe", "do x")
    fail = doctor.Check("c", "fail", "no", "do y")
    assert doctor.exit_code([ok, warn]) == doctor.EXIT_OK == 0
    assert doctor.exit_code([ok, warn, fail]) == doctor.EXIT_FAILED == 1
    assert doctor.EXIT_UNREACHABLE == 2
    text = doctor.report([ok, warn, fail], as_json=False)
    assert "FAIL  c" in text
    assert "fix: do y" in text
    assert "fix: do x" in text
