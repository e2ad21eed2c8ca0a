"""Structural-schema handling of custom resources: pruning, defaulting and validation.

The order and rules follow the apiextensions server: first nulls of non-nullable fields are dropped,
then defaults fill missing fields, then unknown fields are pruned unless a node says
`x-kubernetes-preserve-unknown-fields`; finally the result is validated (OpenAPI keywords, list types,
CEL rules), with ratcheting on updates: a value equal to its old value is not validated again, except
by transition rules (validation ratcheting, KEP-4008, on by default since Kubernetes 1.30). The root
and every `x-kubernetes-embedded-resource` keep `apiVersion`, `kind` and the ObjectMeta fields of
`metadata` whatever their schema says, because the server treats them as objects.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from tests.support.apiserver import cel
from tests.support.apiserver.errors import FieldError, render_value

Schema = dict[str, Any]
MISSING = cel.MISSING

OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_RESOURCE_KEYS = ("apiVersion", "kind", "metadata")
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def normalize(obj: dict[str, Any], schema: Schema) -> dict[str, Any]:
    """Return `obj` with non-nullable nulls dropped, defaults applied and unknown fields pruned."""
    result: dict[str, Any] = _normalize(obj, schema, embedded=True)
    return result


def _normalize(value: Any, schema: Schema, *, embedded: bool = False) -> Any:
    if isinstance(value, list):
        items = schema.get("items")
        return [_normalize(v, items) for v in value] if isinstance(items, dict) else value
    if not isinstance(value, dict):
        return value
    embedded = embedded or bool(schema.get("x-kubernetes-embedded-resource"))
    props: dict[str, Schema] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
    result: dict[str, Any] = {}
    for key, item in value.items():
        sub = props.get(key) if key in props else extra if isinstance(extra, dict) else None
        if embedded and key == "metadata" and isinstance(item, dict):
            result[key] = {k: v for k, v in item.items() if k in OBJECT_META_FIELDS}
        elif embedded and key in _RESOURCE_KEYS:
            result[key] = item
        elif sub is not None:
            if item is None and not sub.get("nullable"):
                continue  # dropped, then maybe defaulted below
            result[key] = _normalize(item, sub)
        elif keep_unknown:
            result[key] = item
    for key, sub in props.items():
        if key not in result and "default" in sub and not (embedded and key in _RESOURCE_KEYS):
            result[key] = _normalize(copy.deepcopy(sub["default"]), sub)
    return result


def validate(obj: dict[str, Any], schema: Schema, old: Any = MISSING) -> list[FieldError]:
    """Every schema violation of `obj`; `old` (the stored object) enables CEL transition rules."""
    errors: list[FieldError] = []
    _validate(obj, schema, "", old, errors, embedded=True)
    return errors


def _validate(
    value: Any, schema: Schema, path: str, old: Any, errors: list[FieldError], *, embedded: bool = False
) -> None:
    if old is not MISSING and value == old:
        _check_transitions(value, schema, path, errors, embedded=embedded)
        return
    if value is None:
        if not schema.get("nullable") and (schema.get("type") or schema.get("x-kubernetes-int-or-string")):
            errors.append(FieldError.type_invalid(path, value, schema.get("type") or "integer or string"))
        return
    if not _type_ok(value, schema, path, errors):
        return  # the other keywords and rules would only repeat the type error
    _check_scalar(value, schema, path, errors)
    if isinstance(value, list):
        _check_list(value, schema, path, old, errors)
    elif isinstance(value, dict):
        _check_object(
            value,
            schema,
            path,
            old,
            errors,
            embedded=embedded or bool(schema.get("x-kubernetes-embedded-resource")),
        )
    _check_combinators(value, schema, path, errors)
    if schema.get("x-kubernetes-validations"):
        errors.extend(
            cel.check(schema["x-kubernetes-validations"], value, old, schema, path, root=path == "")
        )


def _check_transitions(
    value: Any, schema: Schema, path: str, errors: list[FieldError], *, embedded: bool
) -> None:
    """An unchanged value: only the transition rules in its schema are evaluated (ratcheting)."""
    if not _has_transition_rules(schema):
        return
    rules = [
        rule
        for rule in schema.get("x-kubernetes-validations") or ()
        if cel.is_transition(rule) and not cel.holds_when_unchanged(rule)
    ]
    if rules:
        errors.extend(cel.check(rules, value, value, schema, path, root=path == ""))
    if isinstance(value, dict):
        props: dict[str, Schema] = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        embedded = embedded or bool(schema.get("x-kubernetes-embedded-resource"))
        for key, item in value.items():
            sub = props.get(key) or (extra if isinstance(extra, dict) and key not in props else None)
            if sub is not None and not (embedded and key in _RESOURCE_KEYS):
                where = _join(path, key) if key in props else f"{path}[{key}]"
                _check_transitions(item, sub, where, errors, embedded=False)
    elif isinstance(value, list) and schema.get("x-kubernetes-list-type") == "map":
        for index, item in enumerate(value):  # only map-list items correlate with old items
            _check_transitions(item, schema.get("items") or {}, f"{path}[{index}]", errors, embedded=False)


_TRANSITIONS: dict[int, tuple[Schema, bool]] = {}  # id(schema) -> (schema, answer); keeps the id alive


def _has_transition_rules(schema: Schema) -> bool:
    cached = _TRANSITIONS.get(id(schema))
    if cached is not None and cached[0] is schema:
        return cached[1]
    subs = [*(schema.get("properties") or {}).values()]
    subs += [s for s in (schema.get("items"), schema.get("additionalProperties")) if isinstance(s, dict)]
    answer = any(
        cel.is_transition(rule) and not cel.holds_when_unchanged(rule)
        for rule in schema.get("x-kubernetes-validations") or ()
    ) or any(_has_transition_rules(sub) for sub in subs)
    _TRANSITIONS[id(schema)] = (schema, answer)
    return answer


def _type_ok(value: Any, schema: Schema, path: str, errors: list[FieldError]) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, int | str) and not isinstance(value, bool)
        expected = "integer or string"
    else:
        expected = schema.get("type", "")
        ok = not expected or (
            isinstance(value, _TYPES[expected]) and (expected == "boolean" or not isinstance(value, bool))
        )
    if not ok:
        errors.append(FieldError.type_invalid(path, value, expected))
    return ok


def _check_scalar(value: Any, schema: Schema, path: str, errors: list[FieldError]) -> None:
    if "enum" in schema and value not in schema["enum"]:
        errors.append(FieldError.not_supported(path, value, schema["enum"]))
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(
                FieldError(
                    path, "FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes"
                )
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                FieldError.invalid(
                    path, value, f"{path} in body should be at least {schema['minLength']} chars long"
                )
            )
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(
                FieldError.invalid(path, value, f"{path} in body should match '{schema['pattern']}'")
            )
    elif isinstance(value, int | float) and not isinstance(value, bool):
        for key, exclusive, word in (
            ("minimum", "exclusiveMinimum", "greater"),
            ("maximum", "exclusiveMaximum", "less"),
        ):
            if key not in schema:
                continue
            bound, strict = schema[key], bool(schema.get(exclusive))
            broken = (
                (value <= bound if strict else value < bound)
                if word == "greater"
                else (value >= bound if strict else value > bound)
            )
            if broken:
                relation = f"{word} than" if strict else f"{word} than or equal to"
                errors.append(FieldError.invalid(path, value, f"{path} in body should be {relation} {bound}"))
        if schema.get("multipleOf") and value % schema["multipleOf"]:
            errors.append(
                FieldError.invalid(
                    path, value, f"{path} in body should be a multiple of {schema['multipleOf']}"
                )
            )


def _check_list(value: list[Any], schema: Schema, path: str, old: Any, errors: list[FieldError]) -> None:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(
            FieldError(
                path,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
            )
        )
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(
            FieldError.invalid(path, value, f"{path} in body should have at least {schema['minItems']} items")
        )
    list_type = schema.get("x-kubernetes-list-type")
    map_keys: list[str] = schema.get("x-kubernetes-list-map-keys") or []
    old_by_key: dict[str, Any] = {}
    if list_type == "map" and isinstance(old, list):
        old_by_key = {_map_key(item, map_keys): item for item in old if isinstance(item, dict)}
    seen: set[str] = set()
    for index, item in enumerate(value):
        if list_type in ("set", "map"):
            identity = (
                _map_key(item, map_keys)
                if list_type == "map" and isinstance(item, dict)
                else (json.dumps(item, sort_keys=True))
            )
            if identity in seen:
                errors.append(
                    FieldError.duplicate(
                        f"{path}[{index}]", item if list_type == "set" else {k: item.get(k) for k in map_keys}
                    )
                )
            seen.add(identity)
        old_item = (
            old_by_key.get(_map_key(item, map_keys), MISSING)
            if old_by_key and isinstance(item, dict)
            else MISSING
        )  # only map-lists correlate items with the old object
        _validate(item, schema.get("items") or {}, f"{path}[{index}]", old_item, errors)


def _map_key(item: dict[str, Any], keys: list[str]) -> str:
    return json.dumps([item.get(k) for k in keys])


def _check_object(
    value: dict[str, Any], schema: Schema, path: str, old: Any, errors: list[FieldError], *, embedded: bool
) -> None:
    props: dict[str, Schema] = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key in schema.get("required") or ():
        if key not in value:
            errors.append(FieldError.required(_join(path, key)))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(
            FieldError(
                path,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {schema['maxProperties']} items",
            )
        )
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        errors.append(
            FieldError.invalid(
                path, value, f"{path} in body should have at least {schema['minProperties']} properties"
            )
        )
    old_map = old if isinstance(old, dict) else {}
    for key, item in value.items():
        if embedded and key in _RESOURCE_KEYS:
            continue  # apiVersion/kind/metadata of a resource are the server's business, not the schema's
        if key in props:
            _validate(item, props[key], _join(path, key), old_map.get(key, MISSING), errors)
        elif isinstance(extra, dict):
            _validate(item, extra, f"{path}[{key}]", old_map.get(key, MISSING), errors)


def _check_combinators(value: Any, schema: Schema, path: str, errors: list[FieldError]) -> None:
    """allOf/anyOf/oneOf/not: in structural schemas these only add value validations."""

    def passes(sub: Schema) -> bool:
        found: list[FieldError] = []
        _validate(value, sub, path, MISSING, found)
        return not found

    for sub in schema.get("allOf") or ():
        _validate(value, sub, path, MISSING, errors)
    if schema.get("anyOf") and not any(passes(sub) for sub in schema["anyOf"]):
        errors.append(FieldError.invalid(path, value, "must validate at least one schema (anyOf)"))
    if schema.get("oneOf") and sum(passes(sub) for sub in schema["oneOf"]) != 1:
        errors.append(FieldError.invalid(path, value, "must validate one and only one schema (oneOf)"))
    if isinstance(schema.get("not"), dict) and passes(schema["not"]):
        errors.append(
            FieldError.invalid(path, value, f"must not validate the schema (not): {render_value(value)}")
        )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key
