"""Which resources the server serves: kmock's bundled builtins plus the installed CRDs.

A resource is keyed by (group, plural), not by version: like the real server, objects are stored once
(in the storage version) and every served version reads and writes the same objects, with only
`apiVersion` differing (CRD conversion strategy `None`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import kmock

from tests.support.apiserver import cel
from tests.support.apiserver.errors import FieldError

Schema = dict[str, Any]
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
NAMESPACES = ("", "namespaces")


@dataclass
class ResourceType:
    group: str
    plural: str
    kind: str
    namespaced: bool
    versions: list[str]  # served, preferred first
    storage_version: str
    singular: str = ""
    verbs: set[str] = field(default_factory=set)
    subresources: set[str] = field(default_factory=set)
    short_names: set[str] = field(default_factory=set)
    categories: set[str] = field(default_factory=set)
    schemas: dict[str, Schema] = field(default_factory=dict)  # version -> openAPIV3Schema
    crd_name: str | None = None  # set for custom resources

    @property
    def key(self) -> tuple[str, str]:
        return self.group, self.plural

    @property
    def custom(self) -> bool:
        return self.crd_name is not None

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def qualified(self) -> str:
        """`rayjobs.ray.io`, or `configmaps` for the core group, as error messages name resources."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version: str | None = None) -> str:
        version = version or self.storage_version
        return f"{self.group}/{version}" if self.group else version

    def storage_key(self) -> kmock.resource:
        """The key of this resource's objects in kmock's `ObjectsArray`."""
        return kmock_resource(self.group, self.storage_version, self.plural)


@functools.cache
def kmock_resource(group: str, version: str, plural: str) -> kmock.resource:
    """kmock's immutable resource key, built once: its constructor's protocol checks are slow."""
    return kmock.resource(group, version, plural)


def version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' version order: GA before beta before alpha, then higher numbers first."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not match:
        return (3, 0, 0)  # non-conforming versions sort last
    stage = {None: 0, "beta": 1, "alpha": 2}[match.group(2)]
    return (stage, -int(match.group(1)), -int(match.group(3) or 0))


class Registry:
    """The served resources, mirrored into kmock's `resources` array, which its discovery endpoints read."""

    def __init__(self, discovery: kmock.ResourcesArray) -> None:
        self._types: dict[tuple[str, str], ResourceType] = {}
        self._discovery = discovery

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._types.values()))

    def load_builtins(self) -> None:
        """Serve kmock's bundled builtins (a k3s cluster's resources), each with all its versions."""
        bundled = kmock.ResourcesArray()
        bundled.load_bundled()
        versions: dict[tuple[str, str], list[str]] = {}
        for res in bundled:
            versions.setdefault((res.group or "", res.plural or ""), []).append(res.version or "")
        for res in bundled:
            served = sorted(versions[res.group or "", res.plural or ""], key=version_priority)
            if res.version != served[0]:
                continue  # described once, by its preferred (and storage) version
            info = bundled[res]
            self.add(
                ResourceType(
                    group=res.group or "",
                    plural=res.plural or "",
                    kind=info.kind or res.plural or "",
                    namespaced=bool(info.namespaced),
                    versions=served,
                    storage_version=served[0],
                    singular=info.singular or "",
                    verbs=set(info.verbs),
                    subresources=set(info.subresources),
                    short_names=set(info.shortnames),
                    categories=set(info.categories),
                )
            )

    def add(self, rt: ResourceType) -> None:
        self.remove(rt.key)
        self._types[rt.key] = rt
        for version in rt.versions:
            self._discovery[kmock.resource(rt.group, version, rt.plural)] = kmock.ResourceInfo(
                kind=rt.kind,
                singular=rt.singular or rt.kind.lower(),
                namespaced=rt.namespaced,
                verbs=rt.verbs,
                subresources=rt.subresources,
                shortnames=rt.short_names,
                categories=rt.categories,
            )

    def remove(self, key: tuple[str, str]) -> None:
        rt = self._types.pop(key, None)
        if rt is not None:
            for version in rt.versions:
                del self._discovery[kmock.resource(rt.group, version, rt.plural)]

    def get(self, group: str, plural: str, version: str | None = None) -> ResourceType | None:
        rt = self._types.get((group, plural))
        if rt is None or (version is not None and version not in rt.versions):
            return None
        return rt

    def lookup(self, api_version: str, kind_or_plural: str) -> ResourceType:
        """Find a resource by `apiVersion` and either its kind (`RayJob`) or its plural (`rayjobs`)."""
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and version in rt.versions and kind_or_plural in (rt.kind, rt.plural):
                return rt
        raise LookupError(f"the server does not serve {kind_or_plural!r} in {api_version!r}")


def resource_type_from_crd(crd: dict[str, Any]) -> ResourceType:
    """Build the served resource of a CRD, or raise ValueError listing what the real server rejects."""
    errors: list[FieldError] = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group", ""), names.get("plural", ""), names.get("kind", "")
    for path, value in (("spec.group", group), ("spec.names.plural", plural), ("spec.names.kind", kind)):
        if not value:
            errors.append(FieldError.required(path))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        errors.append(FieldError.not_supported("spec.scope", spec.get("scope"), ["Cluster", "Namespaced"]))
    name = (crd.get("metadata") or {}).get("name")
    if group and plural and name != f"{plural}.{group}":
        errors.append(FieldError.invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    versions = spec.get("versions") or []
    storage = [v["name"] for v in versions if v.get("storage")]
    if len(storage) != 1:
        errors.append(
            FieldError.invalid(
                "spec.versions", len(storage), "must have exactly one version marked as storage version"
            )
        )
    schemas: dict[str, Schema] = {}
    subresources: set[str] = set()
    for index, version in enumerate(versions):
        schema = ((version.get("schema") or {}).get("openAPIV3Schema")) or {}
        if not schema.get("type") and not schema.get("x-kubernetes-preserve-unknown-fields"):
            errors.append(FieldError.required(f"spec.versions[{index}].schema.openAPIV3Schema.type"))
        path = f"spec.versions[{index}].schema.openAPIV3Schema"
        errors.extend(cel.compile_errors(schema, path))
        if version.get("served", True):
            schemas[version["name"]] = schema
            subresources |= set((version.get("subresources") or {}).keys())
    if errors:
        raise CRDInvalidError(errors)
    return ResourceType(
        group=group,
        plural=plural,
        kind=kind,
        namespaced=spec["scope"] == "Namespaced",
        versions=sorted(schemas, key=version_priority),
        storage_version=storage[0],
        singular=names.get("singular") or kind.lower(),
        verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
        subresources=subresources,
        short_names=set(names.get("shortNames") or ()),
        categories=set(names.get("categories") or ()),
        schemas=schemas,
        crd_name=name,
    )


class CRDInvalidError(ValueError):
    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(map(str, errors)))
        self.errors = errors
