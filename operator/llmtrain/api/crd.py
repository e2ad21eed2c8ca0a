"""Generate the LLMTrainingJob CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema 2020-12 with $refs, anyOf-null for optional fields and numeric
exclusive bounds; Kubernetes wants a structural OpenAPI v3.0 schema: every node typed, no $ref,
boolean exclusive bounds, and a description on every field for `kubectl explain`.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from llmtrain import plain_yaml
from llmtrain.api.job import LLMTrainingJob
from llmtrain.constants import API_GROUP, API_VERSION, GROUP_VERSION, KIND, PLURAL

# Keys Kubernetes accepts in a structural schema node, in the order they are written out.
_KEPT = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
)

CRD_FILENAME = f"{API_GROUP}_{PLURAL}.yaml"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Strategy", "type": "string", "jsonPath": ".spec.strategy.type"},
    {"name": "Workers", "type": "integer", "jsonPath": ".spec.resources.workers"},
    {
        "name": "GPUs",
        "type": "integer",
        "jsonPath": ".spec.resources.gpusPerWorker",
        "description": "GPUs per worker",
    },
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "EvalLoss", "type": "number", "jsonPath": ".status.progress.evalLoss", "priority": 1},
    {"name": "Method", "type": "string", "jsonPath": ".spec.method.type", "priority": 1},
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name", "priority": 1},
    {"name": "Tokens/s", "type": "number", "jsonPath": ".status.progress.tokensPerSecond", "priority": 1},
    {"name": "ETA(s)", "type": "integer", "jsonPath": ".status.progress.etaSeconds", "priority": 1},
    {"name": "RayJob", "type": "string", "jsonPath": ".status.rayJobName", "priority": 1},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
]


class _WithFactoryDefaults(GenerateJsonSchema):
    """Emit `default` for fields with a default_factory too (pydantic leaves them out), so the
    API server applies the same defaults as the models."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            value = factory()  # type: ignore[call-arg]
            default: Any = {} if isinstance(value, BaseModel) else value
            json_schema = self.generate_inner(schema["schema"])
            if default in ({}, []) and not isinstance(value, BaseModel):
                return json_schema  # empty maps and lists: nothing to default
            return {**json_schema, "default": default}
        return super().default_schema(schema)


class _Converter:
    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs

    def node(self, raw: dict[str, Any]) -> dict[str, Any]:
        raw = self._flatten(raw)
        out: dict[str, Any] = {}
        if raw.get("type") == "null":
            raise ValueError(f"a field that can only be null cannot be expressed: {raw}")
        if "const" in raw:
            raw.setdefault("enum", [raw.pop("const")])
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            # JSON Schema 2020-12 numeric bound -> OpenAPI v3.0 boolean flag.
            if isinstance(raw.get(bound), int | float) and not isinstance(raw.get(bound), bool):
                raw["minimum" if bound == "exclusiveMinimum" else "maximum"] = raw[bound]
                raw[bound] = True
        if "enum" in raw and "type" not in raw:
            raw["type"] = _json_type(raw["enum"][0])
        if raw.get("type") == "object" or "properties" in raw:
            raw["type"] = "object"
            props = raw.get("properties", {})
            raw["properties"] = {k: self.node(v) for k, v in props.items()}
            if not raw["properties"]:
                del raw["properties"]
            extra = raw.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                raw["additionalProperties"] = self.node(extra)
            elif "properties" not in raw and not raw.get("x-kubernetes-preserve-unknown-fields"):
                # dict[str, Any]: free-form, kept as is by the API server.
                raw["x-kubernetes-preserve-unknown-fields"] = True
                raw.pop("additionalProperties", None)
            else:
                raw.pop("additionalProperties", None)
        if raw.get("type") == "array":
            raw["items"] = self.node(raw["items"])
        if "default" in raw and isinstance(raw["default"], dict) and raw.get("properties"):
            # Let the API server fill nested defaults instead of freezing a serialized copy here.
            raw["default"] = {}
        for key in _KEPT:
            if key in raw:
                out[key] = raw[key]
        if "type" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            raise ValueError(f"untyped schema node: {raw}")
        return out

    def _flatten(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Resolve $ref, allOf and Optional (anyOf with null) into one plain node."""
        raw = copy.deepcopy(raw)
        if "$ref" in raw:
            target = self.defs[raw.pop("$ref").rsplit("/", 1)[-1]]
            merged = copy.deepcopy(target)
            rules = merged.get("x-kubernetes-validations", []) + raw.pop("x-kubernetes-validations", [])
            merged.update(raw)  # the field's description/default win over the model's
            if rules:
                merged["x-kubernetes-validations"] = rules
            raw = merged
        if "allOf" in raw and len(raw["allOf"]) == 1:
            inner = self._flatten(raw.pop("allOf")[0])
            inner.update(raw)
            raw = inner
        if "anyOf" in raw:
            options = [o for o in raw.pop("anyOf") if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"unions other than Optional[X] are not structural: {options}")
            inner = self._flatten(options[0])
            if raw.get("default", "missing") is None:
                raw.pop("default")
            desc = raw.get("description") or inner.get("description")
            rules = inner.get("x-kubernetes-validations", []) + raw.pop("x-kubernetes-validations", [])
            inner.update(raw)
            if rules:
                inner["x-kubernetes-validations"] = rules
            if desc:
                inner["description"] = desc
            raw = inner
        if raw.get("description"):
            raw["description"] = " ".join(str(raw["description"]).split())
        raw.pop("title", None)
        return raw


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def openapi_schema() -> dict[str, Any]:
    """The structural openAPIV3Schema of LLMTrainingJob."""
    raw = LLMTrainingJob.model_json_schema(
        by_alias=True, mode="validation", schema_generator=_WithFactoryDefaults
    )
    defs = raw.pop("$defs", {})
    converter = _Converter(defs)
    root = converter.node(raw)
    props = root["properties"]
    props["apiVersion"] = {"type": "string", "description": GROUP_VERSION}
    props["kind"] = {"type": "string", "description": KIND}
    props["metadata"] = {"type": "object"}
    status = props["status"]
    status["properties"]["kopf"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": "Operator bookkeeping (Kopf progress and diff base); not for users.",
    }
    status.pop("x-kubernetes-preserve-unknown-fields", None)
    status.pop("default", None)
    root["required"] = ["spec"]
    root.pop("default", None)
    return root


CRD_KEEP_ANNOTATIONS = {
    "helm.sh/resource-policy": "keep",
    "kustomize.toolkit.fluxcd.io/prune": "disabled",
}


def crd() -> dict[str, Any]:
    """The complete CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{API_GROUP}",
            "labels": {"app.kubernetes.io/name": "llmtrain", "app.kubernetes.io/part-of": "llmtrain"},
            # Deleting the CRD deletes every job, its RayJob and its created PVC with the
            # checkpoints. Helm never deletes crds/; these keep GitOps tools from doing it on an
            # app deletion or prune: Argo CD (2.8+) honours Helm's keep policy, Flux its own.
            "annotations": CRD_KEEP_ANNOTATIONS,
        },
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["llmtj"],
                "categories": ["llmtrain", "ml"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = "# Generated by `make generate` from llmtrain/api (pydantic models). Do not edit.\n"
    return header + plain_yaml.dump(crd(), width=100)
