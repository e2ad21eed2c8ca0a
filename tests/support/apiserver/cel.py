"""CEL `x-kubernetes-validations` rules, evaluated with `common-expression-language` (Rust CEL).

What the real server does and this module copies: `self` is the value at the schema node carrying the
rule, typed by the schema (so `number` fields are doubles even when written as `1`); a rule that
mentions `oldSelf` is a transition rule and runs only on update, when the node has a correlated old
value; a failed rule reports `message`, else the result of `messageExpression`, else
`failed rule: <rule>`, at the node's path plus the rule's `fieldPath`, with the rule's `reason`.

A compiled evaluator, like the real server's cel-go: a pure-Python interpreter (cel-python) spent
~1 ms a rule, which made CEL most of this server's cost per write in the operator benchmark. The
project's own rules are also checked with cel-python in tests/unit/test_cel_rules.py, so two
independent CEL implementations agree on them.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import cel

from tests.support.apiserver.errors import FieldError

Schema = dict[str, Any]
MISSING: Any = object()  # "no correlated old value"; distinct from a stored null

_OLD_SELF = re.compile(r"\boldSelf\b")
_FIELD_PATH_PART = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\['([^']*)'\]")


@functools.cache
def program(rule: str) -> cel.Program:
    """Parse once per rule text: the same CRDs are installed into a fresh server for every test."""
    return cel.compile(rule)


def compile_errors(schema: Schema, path: str) -> list[FieldError]:
    """Syntax errors of every rule in a CRD schema (the real server rejects such CRDs with 422)."""
    errors: list[FieldError] = []

    def walk(node: Any, where: str) -> None:
        if not isinstance(node, dict):
            return
        for index, rule in enumerate(node.get("x-kubernetes-validations") or ()):
            for key in ("rule", "messageExpression"):
                if key not in rule:
                    continue
                try:
                    program(rule[key])
                except ValueError as e:  # the binding's syntax error
                    errors.append(
                        FieldError.invalid(
                            f"{where}.x-kubernetes-validations[{index}].{key}",
                            rule[key],
                            f"compilation failed: {e}",
                        )
                    )
        for key, sub in (node.get("properties") or {}).items():
            walk(sub, f"{where}.properties[{key}]")
        for key in ("items", "additionalProperties"):
            walk(node.get(key), f"{where}.{key}")

    walk(schema, path)
    return errors


def is_transition(rule: dict[str, Any]) -> bool:
    """A transition rule compares with the old value (`oldSelf`) and so runs only on updates."""
    return bool(_OLD_SELF.search(rule["rule"]))


def holds_when_unchanged(rule: dict[str, Any]) -> bool:
    """The immutability idiom `self == oldSelf` is true whenever the value did not change."""
    return re.sub(r"\s+", "", rule["rule"]) in ("self==oldSelf", "oldSelf==self")


def check(
    rules: list[dict[str, Any]], value: Any, old: Any, schema: Schema, path: str, *, root: bool = False
) -> list[FieldError]:
    """Evaluate the rules of one schema node; `old` is MISSING on create or without correlation."""
    errors: list[FieldError] = []
    self_value = typed(_visible_root(value) if root else value, schema)
    for rule in rules:
        text = rule["rule"]
        activation: dict[str, Any] = {"self": self_value}
        if is_transition(rule):
            if old is MISSING:
                continue  # transition rules need an old value (optionalOldSelf is not supported)
            activation["oldSelf"] = typed(_visible_root(old) if root else old, schema)
        field = path + _field_path_suffix(rule.get("fieldPath", ""))
        reason = rule.get("reason", "FieldValueInvalid")
        result = _evaluate(text, activation)
        if isinstance(result, Exception):
            errors.append(FieldError.invalid(field, value, f"{result} evaluating rule: {text}"))
        elif result is not True:
            message = _message(rule, activation) or f"failed rule: {text}"
            errors.append(FieldError.invalid(field, value, message, reason))
    return errors


def _evaluate(text: str, activation: dict[str, Any]) -> Any:
    """The rule's value, or the evaluation error (the binding raises KeyError, TypeError...)."""
    try:
        return program(text).execute(activation)
    except Exception as e:
        return EvaluationError(f"{type(e).__name__}: {e}")


class EvaluationError(Exception):
    """A rule that could not be evaluated (no such key, no such overload, ...)."""


def _message(rule: dict[str, Any], activation: dict[str, Any]) -> str | None:
    if rule.get("message"):
        return str(rule["message"])
    if rule.get("messageExpression"):
        result = _evaluate(rule["messageExpression"], activation)
        if isinstance(result, str) and result.strip():
            return str(result)
    return None


def _field_path_suffix(field_path: str) -> str:
    """`.spec.a['b']` -> `.spec.a.b`: a rule's fieldPath is relative to the node holding the rule."""
    return "".join(f".{a or b}" for a, b in _FIELD_PATH_PART.findall(field_path))


def _visible_root(value: Any) -> Any:
    """At the root, CEL sees only `metadata.name` and `metadata.generateName`, as in Kubernetes."""
    if not isinstance(value, dict) or not isinstance(value.get("metadata"), dict):
        return value
    meta = {k: v for k, v in value["metadata"].items() if k in ("name", "generateName")}
    return {**value, "metadata": meta}


def typed(value: Any, schema: Schema | None) -> Any:
    """The value as CEL sees it, typed by the schema: integers in `number` fields become doubles."""
    schema = schema or {}
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return {
            k: typed(v, props.get(k) or (extra if isinstance(extra, dict) else None))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [typed(v, schema.get("items")) for v in value]
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
