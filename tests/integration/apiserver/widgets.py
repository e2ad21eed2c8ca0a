"""A small CRD for testing the server itself: every schema feature the server must honour, in one place."""

from __future__ import annotations

from typing import Any

from tests.support.apiserver import ApiServer

API_VERSION = "example.com/v1"
KIND = "Widget"
PLURAL = "widgets"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["size"],
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.maxSize) || self.maxSize >= self.size",
                    "message": "maxSize must be at least size",
                    "fieldPath": ".maxSize",
                },
                {
                    "rule": "!has(self.ratio) || self.ratio < 1.0",
                    "messageExpression": "'ratio must be below 1, not ' + string(self.ratio)",
                },
            ],
            "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 100},
                "maxSize": {"type": "integer"},
                "ratio": {"type": "number"},
                "color": {"type": "string", "enum": ["red", "green"], "default": "red"},
                "title": {"type": "string", "maxLength": 8, "pattern": "^[a-z]+$"},
                "mode": {
                    "type": "string",
                    "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "mode is immutable"}],
                },
                "replicas": {
                    "x-kubernetes-int-or-string": True,
                    "anyOf": [{"type": "integer"}, {"type": "string"}],
                },
                "note": {"type": "string", "nullable": True},
                "limits": {
                    "type": "object",
                    "default": {},
                    "properties": {"cpu": {"type": "string", "default": "1"}},
                },
                "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                "ports": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string"},
                            "port": {
                                "type": "integer",
                                "x-kubernetes-validations": [
                                    {"rule": "self == oldSelf", "message": "a port number is immutable"}
                                ],
                            },
                        },
                    },
                },
                "config": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"level": {"type": "integer", "default": 3}},
                },
                "template": {
                    "type": "object",
                    "x-kubernetes-embedded-resource": True,
                    "properties": {"spec": {"type": "object", "properties": {"image": {"type": "string"}}}},
                },
            },
        },
        "status": {
            "type": "object",
            "properties": {
                "phase": {"type": "string"},
                "observedSize": {"type": "integer"},
                "kopf": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
            "x-kubernetes-preserve-unknown-fields": True,
        },
    },
}


def crd(schema: dict[str, Any] | None = None, *, status_subresource: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": KIND, "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}} if status_subresource else {},
                    "schema": {"openAPIV3Schema": schema or SCHEMA},
                }
            ],
        },
    }


def widget(
    name: str = "w", namespace: str = "default", *, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": {"size": 1, **spec}}


async def install(server: ApiServer) -> ApiServer:
    await server.install_crd(crd())
    return server
