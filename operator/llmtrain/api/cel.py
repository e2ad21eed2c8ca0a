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
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

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
    return _evaluate_cel(rule, json_to_cel(value), old if old is _MISSING else json_to_cel(old))


def _evaluate_cel(rule: str, value: Any, old: Any = _MISSING) -> bool:
    activation = {"self": value}
    if old is not _MISSING:
        activation["oldSelf"] = old
    try:
        return bool(_program(rule).evaluate(activation))
    except CELEvalError:
        return False


def violations(schema: dict[str, Any], obj: Any, old: Any = _MISSING, path: str = "") -> list[RuleViolation]:
    """Every violated rule under `schema` for `obj`, with the JSON path of the failing node."""
    # Convert once; sub-values of the converted tree are reused for nested rules.
    cel_obj = json_to_cel(obj)
    cel_old = _MISSING if old is _MISSING else json_to_cel(old)
    return list(_walk(schema, obj, cel_obj, old, cel_old, path))


def _walk(
    schema: dict[str, Any], obj: Any, cel_obj: Any, old: Any, cel_old: Any, path: str
) -> Iterator[RuleViolation]:
    for entry in schema.get("x-kubernetes-validations", []):
        rule = entry["rule"]
        if _is_transition(rule):
            if old is _MISSING:
                continue
            ok = _evaluate_cel(rule, cel_obj, cel_old)
        else:
            ok = _evaluate_cel(rule, cel_obj)
        if not ok:
            where = path + entry.get("fieldPath", "")
            yield RuleViolation(where or ".", entry.get("message", f"failed rule: {rule}"), rule)
    if isinstance(obj, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in obj:
                yield from _walk(
                    sub, obj[key], _at(cel_obj, key), *_old_at(old, cel_old, key), f"{path}.{key}"
                )
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, value in obj.items():
                yield from _walk(
                    extra, value, _at(cel_obj, key), *_old_at(old, cel_old, key), f"{path}[{key!r}]"
                )
    elif isinstance(obj, list) and "items" in schema:
        keys = schema.get("x-kubernetes-list-map-keys")
        for i, item in enumerate(obj):
            old_item: Any = _MISSING
            cel_old_item: Any = _MISSING
            if keys and isinstance(old, list) and isinstance(item, dict):
                for j, o in enumerate(old):
                    if isinstance(o, dict) and all(o.get(k) == item.get(k) for k in keys):
                        old_item, cel_old_item = o, cel_old[j]
                        break
            yield from _walk(schema["items"], item, cel_obj[i], old_item, cel_old_item, f"{path}[{i}]")


def _at(cel_map: Any, key: str) -> Any:
    return cel_map[celpy.celtypes.StringType(key)]


def _old_at(old: Any, cel_old: Any, key: str) -> tuple[Any, Any]:
    if isinstance(old, dict) and key in old:
        return old[key], _at(cel_old, key)
    return _MISSING, _MISSING
