"""The rules on single fields and small objects of the tokenfab resources, each a CEL expression and its
Python twin with one message (the kinds are in `tokenfab.api.cel`).

The models attach them: a `ValueRule` or `KeysRule` as a field's after-validator and its CEL rule, an
`ObjectRule` as an object's CEL rule and the check its model validator runs. The spec's cross-field rules
sit beside the spec, in `tokenfab.api.models.spec`. This module imports no model.
"""

from __future__ import annotations

import string

from tokenfab.api.cel import (
    DNS1035_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    LABEL_KEY_FORM,
    LABEL_KEY_PATTERN,
    SOURCE_PATTERN,
    KeysRule,
    ObjectRule,
    ValueRule,
    cel_string,
    go_quote,
    label_keys_rule,
    matches,
    regex_rule,
)

# ----------------------------------------------------------------------------- rules on single fields

NAME_MAX = 40
NAME_RULE = regex_rule(
    DNS1035_PATTERN,
    f"metadata.name must be a DNS-1035 label of at most {NAME_MAX} characters (tokenfab derives pod, Service "
    f"and label names from it): use at most {NAME_MAX} lowercase letters, digits and '-', starting with a "
    "letter and ending with a letter or digit",
    max_len=NAME_MAX,
)

# The headless Service of a deployment's worker pods is <name>-workers: a deployment named <x>-workers
# would give its frontend Service the name of deployment <x>'s workers Service (both applied by tokenfab).
WORKERS_SUFFIX = "-workers"
NAME_SUFFIX_RULE = ValueRule(
    f"!self.endsWith({cel_string(WORKERS_SUFFIX)})",
    f"metadata.name must not end with '{WORKERS_SUFFIX}': tokenfab names the Service of a deployment's "
    f"worker pods <name>{WORKERS_SUFFIX}, so this name would take the Service of the deployment named "
    f"without the suffix: choose a name without the '{WORKERS_SUFFIX}' ending",
    lambda v: isinstance(v, str) and not v.endswith(WORKERS_SUFFIX),
)

# What the API server itself says of a name that is no DNS subdomain (before tokenfab's rule).
_SUBDOMAIN_TEXT = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)


def name_errors(name: str) -> list[str]:
    """The API server's lines for a ModelDeployment's metadata.name: its own DNS-subdomain check on every
    object's name, then tokenfab's NAME_RULE."""
    quoted = go_quote(name)
    if NAME_RULE.check(name):
        if not NAME_SUFFIX_RULE.check(name):
            return [f"metadata.name: Invalid value: {quoted}: {NAME_SUFFIX_RULE.message}"]
        return []
    out = []
    if len(name) > 253:
        out.append(f"metadata.name: Invalid value: {quoted}: must be no more than 253 characters")
    if not matches(DNS_SUBDOMAIN_PATTERN)(name):
        out.append(f"metadata.name: Invalid value: {quoted}: {_SUBDOMAIN_TEXT}")
    out.append(f"metadata.name: Invalid value: {quoted}: {NAME_RULE.message}")
    return out


# The variables tokenfab sets on every worker (tokenfab.planning.contract.ENV_*; a unit test keeps the two
# lists equal). A user variable of the same name comes later in the container's env and would win: a rank,
# group or Dynamo namespace of the user's breaks discovery and the groups' wiring.
RESERVED_ENV = (
    "TOKENFAB_ROLE",
    "TOKENFAB_GROUP",
    "TOKENFAB_RANK",
    "TOKENFAB_WORLD_SIZE",
    "TOKENFAB_GPUS_PER_POD",
    "TOKENFAB_LEADER_ADDRESS",
    "TOKENFAB_WORKERS_SERVICE",
    "TOKENFAB_NAMESPACE",
    "TOKENFAB_ENGINE_CONFIG",
    "TOKENFAB_MODEL_NAME",
    "TOKENFAB_MODEL_SOURCE",
    "TOKENFAB_MODEL_REVISION",
    "TOKENFAB_MODEL_PATH",
    "TOKENFAB_MODEL_CACHE",
    "TOKENFAB_DISAGGREGATION_MODE",
    "TOKENFAB_MPI_SSH_DIR",
    "DYN_NAMESPACE",
    "DYN_SYSTEM_PORT",
    "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS",
    "DYN_RUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT_SECS",
    "DYN_TOPOLOGY_ENABLED",
    "DYN_TOPOLOGY_MOUNT_PATH",
    "DYN_KV_TRANSFER_DOMAIN",
    "DYN_KV_TRANSFER_ENFORCEMENT",
    "DYN_KV_TRANSFER_PREFERRED_WEIGHT",
    "POD_NAME",
    "POD_NAMESPACE",
    "POD_UID",
)
ENV_RESERVED_RULE = ValueRule(
    "!(self in [" + ", ".join(cel_string(n) for n in RESERVED_ENV) + "])",
    "runtime.env may not set a variable tokenfab sets on every worker (" + ", ".join(RESERVED_ENV) + "): "
    "they come from the spec (model, parallelism, serving.drainSeconds, serving.discovery) and the group's "
    "place; remove it",
    lambda v: v not in RESERVED_ENV,
)

IMAGE_RULE = regex_rule(
    r"^\S+$",
    "runtime.image must be an image reference with no whitespace (e.g. ghcr.io/org/worker:1.2 or "
    "registry.example.com/worker@sha256:<digest>): remove the spaces or line breaks",
)

SOURCE_RULE = regex_rule(
    SOURCE_PATTERN,
    "model.source must be hf://<org>/<repo>, s3://<bucket>/<prefix> or pvc://<claim>/<path> (claim: the "
    "name of a PersistentVolumeClaim in this namespace, a DNS subdomain), with a non-empty path after the "
    "scheme and no whitespace anywhere",
)

STORAGE_CLASS_RULE = regex_rule(
    DNS_SUBDOMAIN_PATTERN,
    "model.cache.storageClassName must be the name of a StorageClass (a DNS subdomain: lowercase letters, "
    "digits, '-' and '.')",
)

QUERY_PLACEHOLDERS = ("namespace", "deployment", "role")
# What str.format reads with only those names: text without braces, doubled braces, bare placeholders.
QUERY_PATTERN = r"^([^{}]|\{\{|\}\}|\{(" + "|".join(QUERY_PLACEHOLDERS) + r")\})*$"


def query_formats(query: str) -> bool:
    """Whether str.format fills `query` from {namespace}, {deployment} and {role} alone, each written bare
    (no conversion, format spec, index or attribute): the twin of QUERY_PATTERN, read by string.Formatter."""
    rebuilt = []
    try:
        for literal, name, spec, conversion in string.Formatter().parse(query):
            rebuilt.append(literal.replace("{", "{{").replace("}", "}}"))
            if name is None:
                continue
            if name not in QUERY_PLACEHOLDERS or spec or conversion is not None:
                return False
            rebuilt.append("{" + name + "}")
    except ValueError:  # a single '{' or '}', an unterminated field
        return False
    # `{role:}` parses like `{role}`: only a query that reads back unchanged is written the plain way.
    return "".join(rebuilt) == query


QUERY_RULE = ValueRule(
    f"self.matches({cel_string(QUERY_PATTERN)})",
    "autoscaling.query may use only the placeholders {namespace}, {deployment} and {role}, and every other "
    "brace must be doubled ({{ and }}) as Python's str.format reads it, e.g. "
    'max by (tokenfab_dev_group) (kv_cache_usage{{namespace="{namespace}", role="{role}"}})',
    lambda v: isinstance(v, str) and query_formats(v),
)

MIN_REPLICAS_RULE = ValueRule(
    "self >= 1",
    "minReplicas must be at least 1: scale-to-zero is not supported; set minReplicas to 1, or park the role "
    "by setting autoscaling.enabled to false and the role's replicas to 0",
    lambda v: isinstance(v, int) and v >= 1,
)

PRIORITY_CLASS_RULE = regex_rule(
    DNS_SUBDOMAIN_PATTERN,
    "scheduling.priorityClassName must name a PriorityClass: a DNS subdomain (lowercase letters, digits, '-' "
    "and '.', starting and ending with a letter or digit)",
)
SCHEDULER_NAME_RULE = regex_rule(
    DNS_SUBDOMAIN_PATTERN,
    "scheduling.schedulerName must name a scheduler: a DNS subdomain (lowercase letters, digits, '-' and "
    "'.', starting and ending with a letter or digit)",
)
TOLERATION_KEY_RULE = regex_rule(
    LABEL_KEY_PATTERN,
    f"a toleration key must be a taint key, {LABEL_KEY_FORM}; or leave key out, with operator Exists, to "
    "tolerate every taint",
    allow_empty=True,
)


# ------------------------------------------------------------------------------- rules on free-form maps

NODE_SELECTOR_KEYS_RULE = label_keys_rule(
    f"scheduling.nodeSelector keys must be node label keys, {LABEL_KEY_FORM}"
)


def resource_keys_rule(field: str) -> KeysRule:
    """The rule on the keys of runtime.resources.<field>: resource names."""
    return label_keys_rule(
        f"runtime.resources.{field} keys must be resource names such as cpu, memory or ephemeral-storage "
        f"({LABEL_KEY_FORM})"
    )


def reserved_key_rule(key: str, field: str, message: str | None = None) -> ObjectRule:
    """The rule that extraEngineArgs leaves `key` to tokenfab, which sets it from `field`."""
    return ObjectRule(
        f"!has(self.{key})",
        message or f"{key} is set by tokenfab from {field}: remove it from extraEngineArgs and set {field}",
    )


# ------------------------------------------------------------------------------ rules on small objects

ETCD_NEEDS_ENDPOINTS = ObjectRule(
    "!has(self.discovery) || self.discovery != 'etcd' || has(self.etcdEndpoints)",
    "serving.discovery etcd needs serving.etcdEndpoints (e.g. http://etcd.dynamo-system:2379): set it, or "
    "use serving.discovery kubernetes (no etcd needed)",
    "etcdEndpoints",
    "FieldValueRequired",
)
ENDPOINTS_NEED_ETCD = ObjectRule(
    "!has(self.etcdEndpoints) || (has(self.discovery) && self.discovery == 'etcd')",
    "serving.etcdEndpoints applies to serving.discovery etcd only: remove it, or set serving.discovery to "
    "etcd",
    "etcdEndpoints",
    "FieldValueForbidden",
)

PRESTAGE_NEEDS_CLASS = ObjectRule(
    "!has(self.prestageGroups) || self.prestageGroups == 0 || has(self.storageClassName)",
    "model.cache.prestageGroups stages weights in per-node model caches: set model.cache.storageClassName "
    "(a node-local StorageClass), or set prestageGroups to 0",
    "prestageGroups",
    "FieldValueForbidden",
)
BOUNDS_RULE = ObjectRule(
    "self.minReplicas <= self.maxReplicas",
    "minReplicas must not exceed maxReplicas: raise maxReplicas or lower minReplicas",
)
ENV_VALUE_OR_VALUE_FROM = ObjectRule(
    "!has(self.valueFrom) || !has(self.value) || self.value == ''",
    "an environment variable takes value or valueFrom, not both: remove one of them",
    field="valueFrom",
    reason="FieldValueForbidden",
)
ENV_SOURCES = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef")
ENV_ONE_SOURCE = ObjectRule(
    "[" + ", ".join(f"has(self.{s})" for s in ENV_SOURCES) + "].exists_one(x, x)",
    "valueFrom must set exactly one of " + ", ".join(ENV_SOURCES[:-1]) + f" or {ENV_SOURCES[-1]}",
)
TOLERATION_EXISTS_FORBIDS_VALUE = ObjectRule(
    "self.operator != 'Exists' || !has(self.value) || self.value == ''",
    "a toleration with operator Exists matches every value of its key: remove value, or set operator to "
    "Equal",
    field="value",
    reason="FieldValueForbidden",
)
TOLERATION_EMPTY_KEY_NEEDS_EXISTS = ObjectRule(
    "(has(self.key) && self.key != '') || self.operator == 'Exists'",
    "a toleration without a key tolerates every taint and needs operator Exists: set key, or set operator "
    "to Exists",
    field="operator",
)
TOLERATION_SECONDS_NEED_NO_EXECUTE = ObjectRule(
    "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
    "tolerationSeconds (how long a pod stays bound to a node once the taint appears) applies to effect "
    "NoExecute only: remove it, or set effect to NoExecute",
    field="tolerationSeconds",
    reason="FieldValueForbidden",
)
TOLERATION_RULES = (
    TOLERATION_EMPTY_KEY_NEEDS_EXISTS,
    TOLERATION_EXISTS_FORBIDS_VALUE,
    TOLERATION_SECONDS_NEED_NO_EXECUTE,
)
