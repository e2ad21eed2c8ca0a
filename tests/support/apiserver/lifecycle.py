"""What the API server does to an object on create, update and delete, independent of HTTP.

The checks and their order follow the real server closely enough for an operator's tests: type meta
against the URL, system fields that clients cannot set, the namespace lifecycle, resourceVersion
preconditions, the status subresource split, metadata validation, then for custom resources the CRD's
schema (pruning, defaults, validation, CEL). After every write the "controllers" catch up at once:
garbage collection, namespace cleanup and CRD (un)registration.
"""

from __future__ import annotations

import random
import re
from typing import Any

from tests.support.apiserver import schema as structural
from tests.support.apiserver.errors import FieldError, StatusError, invalid
from tests.support.apiserver.registry import (
    CRDS,
    NAMESPACES,
    CRDInvalidError,
    Registry,
    ResourceType,
    resource_type_from_crd,
)
from tests.support.apiserver.store import Obj, Store, now

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_SYSTEM_FIELDS = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
)
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_KEY = re.compile(r"(" + _SUBDOMAIN.pattern + r"/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_GENERATED_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' alphabet for generateName suffixes


class Lifecycle:
    def __init__(self, registry: Registry, store: Store) -> None:
        self.registry = registry
        self.store = store
        for name in SYSTEM_NAMESPACES:
            self.create(self.builtin(*NAMESPACES), "v1", None, {"metadata": {"name": name}})

    def builtin(self, group: str, plural: str) -> ResourceType:
        rt = self.registry.get(group, plural)
        assert rt is not None, f"builtin resource {plural} is not registered"
        return rt

    def install_crd(self, crd: Obj) -> Obj:
        """Create or replace a CRD, as `kubectl apply` would; its resources are served at once."""
        rt = self.builtin(*CRDS)
        name = (crd.get("metadata") or {}).get("name", "")
        old = self.store.get(rt, None, name)
        if old is None:
            return self.create(rt, "v1", None, crd)
        meta = {**crd.get("metadata", {}), "resourceVersion": old["metadata"]["resourceVersion"]}
        return self.update(rt, "v1", None, old, {**crd, "metadata": meta})

    def create(self, rt: ResourceType, version: str, namespace: str | None, obj: Any) -> Obj:
        obj = with_type_meta(rt, version, obj)
        meta = obj["metadata"] = dict(obj.get("metadata") or {})
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise StatusError.of(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise StatusError.of(500, "resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(_GENERATED_CHARS, k=5))
        for key in _SYSTEM_FIELDS:
            meta.pop(key, None)
        if rt.has_status:
            obj.pop("status", None)  # create cannot set status
        if rt.key == NAMESPACES:
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
        obj = self._admit(rt, version, obj, None)
        if rt.namespaced:
            self._check_namespace_accepts(rt, namespace or "", meta["name"])
        if self.store.get(rt, namespace, meta["name"]) is not None:
            raise StatusError.of(
                409,
                f'{rt.qualified} "{meta["name"]}" already exists',
                reason="AlreadyExists",
                details=details(rt, meta["name"]),
            )
        new_type = self._crd_type(obj) if rt.key == CRDS else None
        created = self.store.insert(rt, obj)
        if new_type is not None:
            self._establish(new_type, created)
        self._settle()
        return served(rt, created, version)

    def update(self, rt: ResourceType, version: str, subresource: str | None, old: Obj, new: Any) -> Obj:
        """Write a new state given by PUT, or by a patch already applied to `old`."""
        new = with_type_meta(rt, version, new)
        meta = new["metadata"] = dict(new.get("metadata") or {})
        old_meta = old["metadata"]
        for key in ("name", "namespace") if rt.namespaced else ("name",):
            if meta.get(key) and meta[key] != old_meta.get(key):
                raise StatusError.of(
                    400,
                    f"the {key} of the object ({meta[key]}) does not match the {key} on the URL "
                    f"({old_meta.get(key)})",
                )
            if old_meta.get(key):
                meta[key] = old_meta[key]
        if meta.get("resourceVersion") and meta["resourceVersion"] != old_meta["resourceVersion"]:
            raise StatusError.of(
                409,
                f'Operation cannot be fulfilled on {rt.qualified} "{meta["name"]}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                details=details(rt, meta["name"]),
            )
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise StatusError.of(
                409,
                f"Precondition failed: UID in precondition: {meta['uid']}, "
                f"UID in object meta: {old_meta['uid']}",
                details=details(rt, meta["name"]),
            )
        for key in _SYSTEM_FIELDS:
            meta.pop(key, None)
            if key in old_meta:
                meta[key] = old_meta[key]
        new = _split_status(rt, subresource, old, new)
        added = set(new["metadata"].get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
        if old_meta.get("deletionTimestamp") and added:
            detail = "no new finalizers can be added if the object is being deleted"
            raise invalid(
                rt.kind, rt.group, meta["name"], [FieldError.forbidden("metadata.finalizers", detail)]
            )
        new = self._admit(rt, version, new, old)
        new_type = self._crd_type(new) if rt.key == CRDS else None
        updated = self.store.update(rt, old, new)
        if new_type is not None:
            self.registry.add(new_type)
        self._settle()
        return served(rt, updated, version)

    def delete(self, rt: ResourceType, version: str, old: Obj, options: dict[str, Any]) -> tuple[Obj, bool]:
        """Delete with DeleteOptions; True if the object is gone, False if finalizers hold it."""
        preconditions = options.get("preconditions") or {}
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) and preconditions[key] != old["metadata"][key]:
                raise StatusError.of(
                    409,
                    f"Precondition failed: {key} in precondition: {preconditions[key]}, "
                    f"{key} in object meta: {old['metadata'][key]}",
                    details=details(rt, old["metadata"]["name"]),
                )
        if options.get("dryRun"):
            raise StatusError.of(400, "dryRun is not supported by the test API server")
        policy = options.get("propagationPolicy") or "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            raise StatusError.of(400, f"unsupported propagationPolicy: {policy}")
        result, gone = self.store.delete(rt, old, policy)
        self._settle()
        return served(rt, result, version), gone

    def _check_namespace_accepts(self, rt: ResourceType, namespace: str, name: str) -> None:
        ns = self.store.get(self.builtin(*NAMESPACES), None, namespace)
        if ns is None:
            raise StatusError.of(
                404, f'namespaces "{namespace}" not found', details={"name": namespace, "kind": "namespaces"}
            )
        if ns["metadata"].get("deletionTimestamp"):
            raise StatusError.of(
                403,
                f'{rt.kind.lower()} "{name}" is forbidden: unable to create new content in namespace '
                f"{namespace} because it is being terminated",
            )

    def _admit(self, rt: ResourceType, version: str, obj: Obj, old: Obj | None) -> Obj:
        """Validate metadata for every resource, and the schema (with defaults and pruning) for CRs."""
        errors = _metadata_errors(rt, obj["metadata"])
        if rt.custom:
            schema = rt.schemas[version]
            obj = structural.normalize(obj, schema)
            old_obj = served(rt, old, version) if old is not None else structural.MISSING
            errors += structural.validate(obj, schema, old_obj)
        if errors:
            raise invalid(rt.kind, rt.group, obj["metadata"].get("name", ""), errors)
        return obj

    def _crd_type(self, crd: Obj) -> ResourceType:
        try:
            return resource_type_from_crd(crd)
        except CRDInvalidError as e:
            name = crd["metadata"].get("name", "")
            raise invalid("CustomResourceDefinition", CRDS[0], name, e.errors) from None

    def _establish(self, new_type: ResourceType, crd: Obj) -> None:
        """What the apiextensions controllers do: serve the resource and report it as Established."""
        self.registry.add(new_type)
        conditions = [
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ]
        status = {
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now()}
                for t, r, m in conditions
            ],
            "acceptedNames": crd["spec"]["names"],
            "storedVersions": [new_type.storage_version],
        }
        self.store.update(self.builtin(*CRDS), crd, {**crd, "status": status})

    def _settle(self) -> None:
        """Let the controllers catch up: garbage collection, and unserving the resources of deleted CRDs."""
        crds = self.builtin(*CRDS)
        while True:
            self.store.collect_garbage()
            gone = [
                rt for rt in self.registry if rt.custom and not self.store.get(crds, None, rt.crd_name or "")
            ]
            if not gone:
                return
            for rt in gone:
                self.store.purge(rt)
                self.registry.remove(rt.key)


def served(rt: ResourceType, obj: Obj, version: str) -> Obj:
    """The object as a given version shows it (only apiVersion differs: there is no conversion)."""
    api_version = rt.api_version(version)
    return obj if obj.get("apiVersion") == api_version else {**obj, "apiVersion": api_version}


def details(rt: ResourceType, name: str | None) -> dict[str, str]:
    return {"name": name or "", "group": rt.group, "kind": rt.plural}


def with_type_meta(rt: ResourceType, version: str, obj: Any) -> Obj:
    """Check apiVersion/kind against the URL and return a shallow copy in the storage version."""
    if not isinstance(obj, dict):
        raise StatusError.of(400, "the body of the request is not a JSON object")
    expected = rt.api_version(version)
    if rt.custom and not (obj.get("apiVersion") and obj.get("kind")):
        raise StatusError.of(400, "Object 'Kind' is missing in the request body")
    if obj.get("apiVersion", expected) != expected:
        raise StatusError.of(
            400,
            f"the API version in the data ({obj['apiVersion']}) does not match the expected API version "
            f"({expected})",
        )
    if obj.get("kind", rt.kind) != rt.kind:
        raise StatusError.of(
            400, f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})"
        )
    return {**obj, "apiVersion": rt.api_version(), "kind": rt.kind}


def _split_status(rt: ResourceType, subresource: str | None, old: Obj, new: Obj) -> Obj:
    """With a status subresource, `/status` writes only status and the main resource everything else."""
    if subresource == "status":  # metadata changes are ignored too
        return {**{k: v for k, v in old.items() if k != "status"}, **_only_status(new)}
    if rt.has_status:
        new = {**{k: v for k, v in new.items() if k != "status"}, **_only_status(old)}
    if rt.key == NAMESPACES:  # a namespace's spec.finalizers change only through /finalize
        new = {**new, "spec": old.get("spec") or {}}
    return new


def _only_status(obj: Obj) -> Obj:
    return {"status": obj["status"]} if "status" in obj else {}


def _metadata_errors(rt: ResourceType, meta: dict[str, Any]) -> list[FieldError]:
    """The ObjectMeta checks every resource gets: names, labels and owner references."""
    name = meta.get("name")
    if not name:
        return [FieldError.required("metadata.name", "name or generateName is required")]
    errors: list[FieldError] = []
    if rt.key == NAMESPACES and not (_LABEL.fullmatch(name) and len(name) <= 63):
        detail = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"
        errors.append(FieldError.invalid("metadata.name", name, detail))
    elif rt.group != "rbac.authorization.k8s.io" and not (_SUBDOMAIN.fullmatch(name) and len(name) <= 253):
        detail = (
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character"
        )
        errors.append(FieldError.invalid("metadata.name", name, detail))
    for key, value in (meta.get("labels") or {}).items():
        if not (_LABEL_KEY.fullmatch(key) and len(key.rpartition("/")[2]) <= 63):
            detail = (
                "a label key is an optional DNS subdomain prefix and '/', and a name of at most 63 characters"
            )
            errors.append(FieldError.invalid("metadata.labels", key, detail))
        if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value) or len(value) > 63:
            detail = (
                "a label value must be empty or at most 63 alphanumeric characters, '-', '_' or '.', "
                "starting and ending with an alphanumeric character"
            )
            errors.append(FieldError.invalid("metadata.labels", value, detail))
    for index, ref in enumerate(meta.get("ownerReferences") or ()):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                errors.append(FieldError.required(f"metadata.ownerReferences[{index}].{key}"))
    return errors
