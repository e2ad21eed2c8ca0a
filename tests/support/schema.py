"""OpenAPI (CRD) schema helpers for tests: strict field validation as `kubectl --validate=strict`."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Unknown fields become errors instead of being pruned, so a misspelled field fails a test."""
    out = copy.deepcopy(schema)
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
        out["properties"] = {k: strict(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = strict(out["items"])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(out["additionalProperties"])
    return out


_VALIDATORS: dict[int, tuple[dict[str, Any], jsonschema.Draft4Validator]] = {}


def validate_strict(obj: Any, schema: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError naming the path of the first problem."""
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = (schema, jsonschema.Draft4Validator(strict(schema)))
        _VALIDATORS[id(schema)] = cached
    cached[1].validate(obj)
