"""Evaluate a structural schema's `x-kubernetes-validations` (CEL) rules against an object.

The same rule text the API server evaluates from the CRD runs here, so `llmtrain validate`
rejects what the cluster would reject, offline. Transition rules (those naming `oldSelf`) run only
when an old object is given and the old value exists, as Kubernetes does on update.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import celpy

_MISSING = object()


@dataclass(frozen=True)
class RuleViolation:
    path: str
    message: str
    rule: str


@functools.cache
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def _is_transition(rule: str) -> bool:
    return "oldSelf" in rule


def evaluate_rule(rule: str, value: Any, old: Any = _MISSING) -> bool:
    """True when the rule holds. An evaluation error (e.g. a missing field) counts as a failure."""
    activation = {"self": celpy.json_to_cel(value)}
    if old is not _MISSING:
        activation["oldSelf"] = celpy.json_to_cel(old)
    try:
        return bool(_program(rule).evaluate(activation))
    except celpy.CELEvalError:
        return False


def violations(schema: dict[str, Any], obj: Any, old: Any = _MISSING, path: str = "") -> list[RuleViolation]:
    """Every violated rule under `schema` for `obj`, with the JSON path of the failing node."""
    return list(_walk(schema, obj, old, path))


def _walk(schema: dict[str, Any], obj: Any, old: Any, path: str) -> Iterator[RuleViolation]:
    for entry in schema.get("x-kubernetes-validations", []):
        rule = entry["rule"]
        if _is_transition(rule):
            if old is _MISSING:
                continue
            ok = evaluate_rule(rule, obj, old)
        else:
            ok = evaluate_rule(rule, obj)
        if not ok:
            where = path + entry.get("fieldPath", "")
            yield RuleViolation(where or ".", entry.get("message", f"failed rule: {rule}"), rule)
    if isinstance(obj, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in obj:
                old_sub = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                yield from _walk(sub, obj[key], old_sub, f"{path}.{key}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in obj.items():
                old_sub = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                yield from _walk(extra, value, old_sub, f"{path}[{key!r}]")
    elif isinstance(obj, list) and "items" in schema:
        keys = schema.get("x-kubernetes-list-map-keys")
        for i, item in enumerate(obj):
            old_item: Any = _MISSING
            if keys and isinstance(old, list) and isinstance(item, dict):
                old_item = next(
                    (o for o in old if isinstance(o, dict) and all(o.get(k) == item.get(k) for k in keys)),
                    _MISSING,
                )
            yield from _walk(schema["items"], item, old_item, f"{path}[{i}]")
