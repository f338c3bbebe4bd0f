"""Every CEL rule in the CRD agrees with its Python twin, on the examples and on generated specs.

The API server runs the CEL; the operator and CLI run the Python. A CEL interpreter evaluates the very
expressions installed in the CRD, over specs with the API server's defaults applied.
"""

from __future__ import annotations

import itertools
from typing import Any, get_args

import celpy
import pytest
import re2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from testing.cases import example_paths, load_example
from tokenfab.api import models as m
from tokenfab.api.cel import ObjectRule, Rule, ValueRule, cel_string
from tokenfab.api.models import SPEC_RULES
from tokenfab.api.rules import (
    ENV_ONE_SOURCE,
    ENV_RESERVED_RULE,
    ENV_VALUE_OR_VALUE_FROM,
    IMAGE_RULE,
    MIN_REPLICAS_RULE,
    NAME_RULE,
    NAME_SUFFIX_RULE,
    NODE_SELECTOR_KEYS_RULE,
    PRIORITY_CLASS_RULE,
    QUERY_PATTERN,
    QUERY_RULE,
    SCHEDULER_NAME_RULE,
    SOURCE_RULE,
    TOLERATION_KEY_RULE,
    TOLERATION_RULES,
    query_formats,
    resource_keys_rule,
)

ENV = celpy.Environment()
PROGRAMS = {r.name: ENV.program(ENV.compile(r.cel)) for r in SPEC_RULES}


def unchecked_spec(data: dict[str, Any]) -> m.ModelDeploymentSpec:
    """Validate each field of a spec but skip the cross-field rules (the thing under test)."""
    fields: dict[str, Any] = {}
    for name, info in m.ModelDeploymentSpec.model_fields.items():
        alias = info.alias or name
        if alias in data:
            # The section's model, also when the field is optional (`Role | None`).
            sub = next(t for t in (info.annotation, *get_args(info.annotation)) if isinstance(t, type))
            fields[name] = sub.model_validate(data[alias])
    return m.ModelDeploymentSpec.model_construct(**fields)


def cel_self(spec: m.ModelDeploymentSpec) -> Any:
    # The API server applies defaults before validation; exclude_none drops absent optionals (has()).
    return celpy.json_to_cel(spec.model_dump(by_alias=True, exclude_none=True))


def cel_says(rule: Rule[m.ModelDeploymentSpec], spec: m.ModelDeploymentSpec, doc: Any = None) -> bool:
    """What the rule's CEL says of the spec (`doc`: the spec as cel_self gives it, to reuse)."""
    result = PROGRAMS[rule.name].evaluate({"self": cel_self(spec) if doc is None else doc})
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
            st.integers(1, 6),
            st.integers(1, 6),
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


def resources() -> st.SearchStrategy[dict[str, Any]]:
    """runtime.resources, at times naming a GPU resource (the default one or example.com/gpu)."""
    names = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/gpu"])
    return st.fixed_dictionaries(
        {},
        optional={
            "requests": st.dictionaries(names, st.integers(1, 8), max_size=2),
            "limits": st.dictionaries(names, st.integers(1, 8), max_size=2),
        },
    )


def model() -> st.SearchStrategy[dict[str, Any]]:
    """spec.model: hf://, s3:// or pvc:// weights, at times with a per-node cache that pre-stages some
    groups."""
    return st.builds(
        lambda source, staged: (
            {"name": "x", "source": source}
            | (
                {}
                if staged is None
                else {"cache": {"storageClassName": "local-nvme", "prestageGroups": staged}}
            )
        ),
        st.sampled_from(["hf://x/y", "s3://bucket/r1", "pvc://weights/r1"]),
        st.one_of(st.none(), st.integers(0, 2)),
    )


specs = st.builds(
    lambda mode, policy, ratio, pre, dec, wrk, enabled, url, bp, bd, bw, gpn, gpd, prof, res, gpu, fr, bf, m: {  # noqa: E501
        "model": m,
        "runtime": {"resources": res},
        "serving": {"mode": mode, "ratioPolicy": policy, "frontendReplicas": fr}
        | ({"prefillDecodeRatio": ratio} if ratio else {}),
        **({"prefill": pre} if pre is not None else {}),
        **({"decode": dec} if dec is not None else {}),
        **({"worker": wrk} if wrk is not None else {}),
        "autoscaling": {"enabled": enabled}
        | ({"prometheusUrl": "http://p:9090"} if url else {})
        | ({"prefill": bp} if bp else {})
        | ({"decode": bd} if bd else {})
        | ({"worker": bw} if bw else {})
        | ({"frontend": bf} if bf else {}),
        "topology": {"gpusPerNode": gpn, "gpusPerDomain": gpd} | ({"gpuResource": gpu} if gpu else {}),
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
    resources(),
    st.sampled_from([None, "example.com/gpu"]),
    st.integers(1, 6),
    st.one_of(
        st.none(), st.fixed_dictionaries({"minReplicas": st.integers(1, 3), "maxReplicas": st.integers(3, 5)})
    ),
    model(),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_cel_and_python_agree_on_generated_specs(data):
    spec = unchecked_spec(data)
    doc = cel_self(spec)
    for rule in SPEC_RULES:
        assert cel_says(rule, spec, doc) == rule.check(spec), rule.name


def test_generated_specs_exercise_both_outcomes_of_every_rule():
    """Guard against a strategy that never breaks (or never satisfies) a rule."""
    seen: dict[str, set[bool]] = {r.name: set() for r in SPEC_RULES}

    # Derandomized (a fixed seed): a rule the strategy breaks in a few percent of specs was once missed
    # by 400 random examples.
    @settings(
        max_examples=800,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(specs)
    def collect(data):
        spec = unchecked_spec(data)
        for rule in SPEC_RULES:
            seen[rule.name].add(rule.check(spec))

    collect()
    missing = {name for name, outcomes in seen.items() if outcomes != {True, False}}
    assert not missing, f"rules never both passed and failed: {sorted(missing)}"


def test_message_expressions_agree_with_the_models():
    """A rule whose message quotes the spec: CEL's messageExpression and the models word it alike."""
    spec = unchecked_spec(load_example("llama-405b-multinode-tp.yaml")["spec"])
    spec.topology.gpu_resource = "example.com/gb200"
    for rule in SPEC_RULES:
        if rule.message_expression is None:
            continue
        program = ENV.program(ENV.compile(rule.message_expression))
        doc = spec.model_dump(by_alias=True, exclude_none=True)
        said = program.evaluate({"self": celpy.json_to_cel(doc)})
        assert str(said) == rule.text(spec), rule.name
        assert "example.com/gb200" in rule.text(spec)


# ------------------------------------------------------------------- rules on single fields and objects


def cel_holds(cel: str, value: Any) -> bool:
    result = ENV.program(ENV.compile(cel)).evaluate({"self": celpy.json_to_cel(value)})
    assert isinstance(result, celpy.celtypes.BoolType), f"{cel} gave {result!r}"
    return bool(result)


# (rule, value, holds): the CEL (RE2, as the API server) and the Python twin (re) must both say `holds`.
VALUE_TABLE: list[tuple[ValueRule, Any, bool]] = [
    *[
        (NAME_RULE, v, ok)
        for v, ok in [
            ("a" * 40, True),
            ("a" * 41, False),
            ("deepseek-r1", True),
            ("r1", True),
            ("a", True),
            ("llama.8b", False),
            ("8b-llama", False),
            ("llama-", False),
            ("Llama", False),
            ("-a", False),
            ("llama_8b", False),
            ("", False),
            ("llama-8b\n", False),
        ]
    ],
    *[
        (NAME_SUFFIX_RULE, v, ok)
        for v, ok in [
            ("llama-workers", False),
            ("workers", True),
            ("llama-workers2", True),
            ("llama-worker", True),
            ("-workers", False),
        ]
    ],
    *[
        (IMAGE_RULE, v, ok)
        for v, ok in [("ghcr.io/a/b:1", True), ("a b", False), ("a\n", False), (" a", False)]
    ],
    *[
        (ENV_RESERVED_RULE, v, ok)
        for v, ok in [("TOKENFAB_RANK", False), ("DYN_NAMESPACE", False), ("HF_TOKEN", True)]
    ],
    *[
        (SOURCE_RULE, v, ok)
        for v, ok in [
            ("hf://deepseek-ai/DeepSeek-R1", True),
            ("hf://gpt2", True),
            ("s3://models/qwen3-235b", True),
            ("s3://bucket", True),
            ("pvc://models/llama-3.1-405b", True),
            ("pvc://my.claim/a/b c", False),
            ("pvc://models/weights/\u00e9t\u00e9", True),
            ("hf://", False),
            ("pvc://", False),
            ("s3://", False),
            ("pvc://models", False),
            ("pvc://models/", False),
            ("pvc://Models/x", False),
            ("pvc://-m/x", False),
            ("hf://deepseek ai/R1 x", False),
            ("hf://a\tb", False),
            ("hf://a/b\n", False),
            ("hf://a\u00a0b", False),
            ("hf://a\u2003b", False),
            ("hf://a\u3000b", False),
            ("hf:///x", False),
            ("s3:///x", False),
            ("https://example.org/w", False),
            ("HF://a/b", False),
            (" hf://a/b", False),
        ]
    ],
    *[
        (QUERY_RULE, v, ok)
        for v, ok in [
            ("", True),
            ("up", True),
            ("{namespace}", True),
            ("{deployment}-{role}", True),
            ('avg(kv{{namespace="{namespace}", role="{role}"}})', True),
            ("{{}}", True),
            ("{{role}}", True),
            ("{{{role}}}", True),
            ("{{{{", True),
            ("}}}}", True),
            ("{pod}", False),
            ("{}", False),
            ("{0}", False),
            ("{role!r}", False),
            ("{role:>10}", False),
            ("{role:}", False),
            ("{role[0]}", False),
            ("{role.upper}", False),
            ("{", False),
            ("}", False),
            ("{{}", False),
            ("{}}", False),
            ("}}}", False),
            ("{role", False),
            ("role}", False),
            ("{{role}", False),
            ('kv{namespace="{namespace}"}', False),
            ("{ role }", False),
            ("{Role}", False),
        ]
    ],
    *[(MIN_REPLICAS_RULE, v, ok) for v, ok in [(1, True), (4096, True), (0, False), (-1, False)]],
    *[
        (r, v, ok)
        for r in (PRIORITY_CLASS_RULE, SCHEDULER_NAME_RULE)
        for v, ok in [
            ("high", True),
            ("system-node-critical", True),
            ("a.b-c", True),
            ("High", False),
            ("a_b", False),
            ("", False),
            ("a..b", False),
            ("-a", False),
        ]
    ],
    *[
        (TOLERATION_KEY_RULE, v, ok)
        for v, ok in [
            ("", True),
            ("dedicated", True),
            ("nvidia.com/gpu", True),
            ("node.kubernetes.io/not-ready", True),
            ("a" * 63, True),
            ("a" * 64, False),
            ("gpu pool", False),
            ("/gpu", False),
            ("Example.com/gpu", False),
            ("example.com/", False),
            ("a/b/c", False),
            ("_a", False),
        ]
    ],
]


@pytest.mark.parametrize(("rule", "value", "holds"), VALUE_TABLE)
def test_value_rules_agree_with_their_twins(rule, value, holds):
    assert cel_holds(rule.cel, value) is holds
    assert rule.check(value) is holds


def test_the_query_rule_accepts_exactly_what_its_formatter_twin_accepts():
    """Every string of up to 6 tokens over braces, a placeholder, an unknown name and format syntax. The
    CEL is `self.matches(QUERY_PATTERN)`; RE2 (what both the API server and celpy run) is called directly,
    as celpy would take minutes for the 137,257 strings."""
    assert QUERY_RULE.cel == f"self.matches({cel_string(QUERY_PATTERN)})"
    pattern = re2.compile(QUERY_PATTERN)
    tokens = ["{", "}", "role", "pod", ":", "!r", "x"]
    for n in range(7):
        for parts in itertools.product(tokens, repeat=n):
            query = "".join(parts)
            cel = pattern.search(query) is not None
            assert cel == query_formats(query), query
            if cel:  # what the rule lets through, str.format fills
                query.format(namespace="ns", deployment="d", role="decode")


KEYS_TABLE = [
    ({}, True),
    ({"cpu": 1, "memory": 1, "ephemeral-storage": 1, "nvidia.com/gpu": 1, "hugepages-2Mi": 1}, True),
    ({"cpu cores": 1}, False),
    ({"cpu": 1, "/memory": 1}, False),
    ({"a" * 63: 1}, True),
    ({"a" * 64: 1}, False),
    ({"example.com/" + "a" * 63: 1}, True),
]


@pytest.mark.parametrize(("keys", "holds"), KEYS_TABLE)
def test_key_rules_agree_with_their_twins(keys, holds):
    for rule in (NODE_SELECTOR_KEYS_RULE, resource_keys_rule("requests")):
        assert cel_holds(rule.cel, keys) is holds
        assert all(rule.check(k) for k in keys) is holds


def broken_object_rules(model: type[BaseModel], data: dict[str, Any]) -> set[str]:
    """Messages of the object rules the models refuse `data` with."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return {
            v["message"]
            for e in exc.errors()
            if e["type"] == "tokenfab_object_rules"
            for v in e["ctx"]["violations"]
        }
    return set()


def cel_broken(rules: tuple[ObjectRule, ...], obj: dict[str, Any]) -> set[str]:
    """Messages of the rules CEL refuses `obj` with (the API server's defaults already in `obj`)."""
    return {r.message for r in rules if not cel_holds(r.cel, obj)}


TOLERATIONS = [
    {"operator": "Exists"},
    {"key": "dedicated", "operator": "Exists"},
    {"key": "dedicated", "operator": "Exists", "value": ""},
    {"key": "dedicated", "operator": "Exists", "value": "gpu"},
    {"key": "dedicated", "value": "gpu"},
    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Equal"},
    {"value": "gpu"},
    {"key": "", "operator": "Equal"},
    {"key": "", "operator": "Exists"},
    {"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    {"key": "a", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30},
    {"key": "a", "operator": "Exists", "tolerationSeconds": 0},
    {"operator": "Exists", "value": "x", "effect": "PreferNoSchedule", "tolerationSeconds": 1},
    {"operator": "Equal", "value": "x", "effect": "NoExecute", "tolerationSeconds": 1},
]


@pytest.mark.parametrize("data", TOLERATIONS)
def test_toleration_rules_agree_with_their_twins(data):
    with_defaults = {"operator": "Equal"} | data  # the CRD's default
    assert cel_broken(TOLERATION_RULES, with_defaults) == broken_object_rules(m.Toleration, data)


ENV_VARS = [
    {"name": "A", "value": "x"},
    {"name": "A", "value": ""},
    {"name": "A"},
    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    {"name": "A", "value": "", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
]
ENV_SOURCES = [
    {},
    {"secretKeyRef": {"name": "s", "key": "k"}},
    {"configMapKeyRef": {"name": "c", "key": "k"}},
    {"fieldRef": {"fieldPath": "status.podIP"}},
    {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
    {"secretKeyRef": {"name": "s", "key": "k"}, "fieldRef": {"fieldPath": "status.podIP"}},
]


@pytest.mark.parametrize("data", ENV_VARS)
def test_env_var_rules_agree_with_their_twins(data):
    assert cel_broken((ENV_VALUE_OR_VALUE_FROM,), data) == broken_object_rules(m.EnvVar, data)


@pytest.mark.parametrize("data", ENV_SOURCES)
def test_env_source_rule_agrees_with_its_twin(data):
    assert cel_broken((ENV_ONE_SOURCE,), data) == broken_object_rules(m.EnvVarSource, data)
