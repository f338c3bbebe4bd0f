"""Every CEL rule in the CRD agrees with its Python twin, on the examples and on generated specs.

The API server runs the CEL; the operator and CLI run the Python. A CEL interpreter evaluates the very
expressions installed in the CRD, over specs with the API server's defaults applied.
"""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cases import example_paths, load_example
from tokenfab.api import models as m
from tokenfab.api.rules import SPEC_RULES, Rule

ENV = celpy.Environment()
PROGRAMS = {r.name: ENV.program(ENV.compile(r.cel)) for r in SPEC_RULES}


def unchecked_spec(data: dict[str, Any]) -> m.ModelDeploymentSpec:
    """Validate each field of a spec but skip the cross-field rules (the thing under test)."""
    fields: dict[str, Any] = {}
    for name, info in m.ModelDeploymentSpec.model_fields.items():
        alias = info.alias or name
        if alias in data:
            annotation = info.annotation
            sub = m.Role if name in m.ROLES else m.Profile if name == "profile" else annotation
            fields[name] = sub.model_validate(data[alias])  # type: ignore[union-attr]
    return m.ModelDeploymentSpec.model_construct(**fields)


def cel_says(rule: Rule, spec: m.ModelDeploymentSpec) -> bool:
    # The API server applies defaults before validation; exclude_none drops absent optionals (has()).
    doc = spec.model_dump(by_alias=True, exclude_none=True)
    result = PROGRAMS[rule.name].evaluate({"self": celpy.json_to_cel(doc)})
    assert isinstance(result, celpy.celtypes.BoolType), f"{rule.name} gave {result!r}"
    return bool(result)


@pytest.mark.parametrize("path", example_paths(), ids=lambda p: p.name)
def test_examples_pass_every_cel_rule(path):
    spec = unchecked_spec(load_example(path.name)["spec"])
    for rule in SPEC_RULES:
        assert cel_says(rule, spec), rule.name


def bounds() -> st.SearchStrategy[dict[str, int] | None]:
    return st.one_of(
        st.none(),
        st.builds(
            lambda a, b: {"minReplicas": min(a, b), "maxReplicas": max(a, b)},
            st.integers(0, 6),
            st.integers(0, 6),
        ),
    )


def role() -> st.SearchStrategy[dict[str, Any] | None]:
    par = st.fixed_dictionaries(
        {
            "tensor": st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 80]),
            "pipeline": st.sampled_from([1, 2, 3]),
            "expert": st.sampled_from([1, 2, 4, 5, 8, 16]),
        }
    )
    return st.one_of(
        st.none(),
        st.builds(
            lambda p, r: ({} if p is None else {"parallelism": p}) | ({} if r is None else {"replicas": r}),
            st.one_of(st.none(), par, par),
            st.one_of(st.none(), st.integers(0, 8)),
        ),
    )


def profile() -> st.SearchStrategy[dict[str, Any] | None]:
    base = {"isl": 4000, "osl": 1000, "ttftMs": 1000, "itlMs": 20}
    return st.one_of(
        st.none(),
        st.builds(
            lambda budget, rate: (
                base | ({"gpuBudget": 72} if budget else {}) | ({"requestRate": 5} if rate else {})
            ),
            st.booleans(),
            st.booleans(),
        ),
    )


specs = st.builds(
    lambda mode, policy, ratio, pre, dec, wrk, enabled, url, bp, bd, bw, gpn, gpd, prof: {
        "model": {"name": "x", "source": "hf://x/y"},
        "serving": {"mode": mode, "ratioPolicy": policy} | ({"prefillDecodeRatio": ratio} if ratio else {}),
        **({"prefill": pre} if pre is not None else {}),
        **({"decode": dec} if dec is not None else {}),
        **({"worker": wrk} if wrk is not None else {}),
        "autoscaling": {"enabled": enabled}
        | ({"prometheusUrl": "http://p:9090"} if url else {})
        | ({"prefill": bp} if bp else {})
        | ({"decode": bd} if bd else {})
        | ({"worker": bw} if bw else {}),
        "topology": {"gpusPerNode": gpn, "gpusPerDomain": gpd},
        **({"profile": prof} if prof is not None else {}),
    },
    st.sampled_from(["aggregated", "disaggregated"]),
    st.sampled_from(["fixed", "independent"]),
    st.one_of(st.none(), st.sampled_from(["1:1", "1:3", "2:5"])),
    role(),
    role(),
    role(),
    st.booleans(),
    st.booleans(),
    bounds(),
    bounds(),
    bounds(),
    st.sampled_from([4, 8]),
    st.sampled_from([8, 70, 72]),
    profile(),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_cel_and_python_agree_on_generated_specs(data):
    spec = unchecked_spec(data)
    for rule in SPEC_RULES:
        assert cel_says(rule, spec) == rule.check(spec), rule.name


def test_generated_specs_exercise_both_outcomes_of_every_rule():
    """Guard against a strategy that never breaks (or never satisfies) a rule."""
    seen: dict[str, set[bool]] = {r.name: set() for r in SPEC_RULES}

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(specs)
    def collect(data):
        spec = unchecked_spec(data)
        for rule in SPEC_RULES:
            seen[rule.name].add(rule.check(spec))

    collect()
    missing = {name for name, outcomes in seen.items() if outcomes != {True, False}}
    assert not missing, f"rules never both passed and failed: {sorted(missing)}"
