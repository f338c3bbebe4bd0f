"""`tokenfab doctor`'s table of what the operator does stays what the chart grants, and its exit codes."""

from __future__ import annotations

from tests.chart import CLUSTER_RULES, NAMESPACED_RULES, merged
from tokenfab import doctor as d


def test_the_access_doctor_checks_is_granted_by_the_chart():
    granted = merged(CLUSTER_RULES, NAMESPACED_RULES)
    for group, resource, verb, _ns in d.OPERATOR_ACCESS:
        assert verb in granted.get((group, resource), set()), (group, resource, verb)
    # every rule of the chart is checked by at least one verb
    checked = {(g, r) for g, r, _v, _n in d.OPERATOR_ACCESS}
    missing = (
        set(granted)
        - checked
        - {
            ("apiextensions.k8s.io", "customresourcedefinitions"),  # kopf's own
            ("tokenfab.dev", "nvlinkdomains/status"),
        }
    )
    assert not missing, missing


def test_exit_codes_are_for_scripts():
    ok = d.Check("a", "pass", "fine")
    warn = d.Check("b", "warn", "maybe", "do x")
    fail = d.Check("c", "fail", "no", "do y")
    assert d.exit_code([ok, warn]) == d.EXIT_OK == 0
    assert d.exit_code([ok, warn, fail]) == d.EXIT_FAILED == 1
    assert d.EXIT_UNREACHABLE == 2
    text = d.report([ok, warn, fail], as_json=False)
    assert "FAIL  c" in text
    assert "fix: do y" in text
    assert "fix: do x" in text
