"""The test API server: kmock's KubernetesEmulator with the object endpoints reimplemented.

kmock 0.8 keeps its HTTP server, discovery endpoints, request log, `objects` history and DSL
reactions; this subclass serves every object endpoint (`/api/v1/...`, `/apis/<group>/<version>/...`)
itself, because kmock's object handling is too simple for an operator's tests (no resourceVersions,
no selectors, no schema, a watch that loses events; see tests/README.md) and its path parser cannot
parse the `namespaces` resource. Discovery, `/version` and any scripted reaction still go to kmock.

Handlers are synchronous between reading and writing the store, so each request is atomic on the
server's event loop, as each request is atomic in etcd.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import random
import re
from dataclasses import dataclass
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock

from tests.support.apiserver import schema as structural
from tests.support.apiserver import selectors
from tests.support.apiserver.errors import FieldError, StatusError, invalid
from tests.support.apiserver.faults import Faults
from tests.support.apiserver.registry import (
    CRDS,
    NAMESPACES,
    CRDInvalidError,
    Registry,
    ResourceType,
    resource_type_from_crd,
    version_priority,
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
_MEDIA_TYPES = "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"


@dataclass(frozen=True)
class Route:
    """An object endpoint: `/api[s]/<group>/<version>[/namespaces/<ns>]/<plural>[/<name>[/<sub>]]`."""

    group: str
    version: str
    plural: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None

    @classmethod
    def parse(cls, path: str) -> Route | None:
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None  # discovery and non-API paths
        namespace = None
        # /namespaces/<ns>/<plural>/..., but /namespaces/<name>/status is the namespace's own subresource
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            namespace, rest = rest[1], rest[2:]
        name = rest[1] if len(rest) > 1 else None
        return cls(group, version, rest[0], namespace, name, "/".join(rest[2:]) or None)

    def verb(self, method: str, params: dict[str, str]) -> str:
        if method == "GET":
            return "watch" if params.get("watch") in ("true", "1") else "get" if self.name else "list"
        verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        if method == "DELETE" and not self.name:
            return "deletecollection"
        if method not in verbs or (method == "POST") == bool(self.name):
            raise StatusError.of(
                405, f"the server does not allow this method on the requested resource: {method}"
            )
        return verbs[method]


_ACTIONS = {
    "list": kmock.action.LIST,
    "watch": kmock.action.WATCH,
    "get": kmock.action.FETCH,
    "create": kmock.action.CREATE,
    "update": kmock.action.UPDATE,
    "patch": kmock.action.UPDATE,
    "delete": kmock.action.DELETE,
}


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    faults: Faults = attrs.field(factory=Faults)
    registry: Registry = attrs.field(init=False)
    store: Store = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.registry = Registry(self.resources)
        self.registry.load_builtins()
        self.store = Store(self.objects, self.registry)
        for name in SYSTEM_NAMESPACES:
            self.create(self._type(*NAMESPACES), "v1", None, {"metadata": {"name": name}})

    # -- in-process API (the fixture calls these in the server's thread) ----------------------------

    def install_crd(self, crd: Obj) -> Obj:
        """Create (or replace) a CRD, as `kubectl apply` would; its resources are served at once."""
        rt = self._type(*CRDS)
        name = (crd.get("metadata") or {}).get("name", "")
        old = self.store.get(rt, None, name)
        if old is None:
            return self.create(rt, "v1", None, crd)
        new = {
            **crd,
            "metadata": {**crd.get("metadata", {}), "resourceVersion": old["metadata"]["resourceVersion"]},
        }
        return self.update(rt, "v1", Route(CRDS[0], "v1", CRDS[1], name=name), old, new)

    def create(self, rt: ResourceType, version: str, namespace: str | None, obj: Any) -> Obj:
        if not isinstance(obj, dict):
            raise StatusError.of(400, "the body of the request is not a JSON object")
        obj = self._with_type_meta(rt, version, obj)
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
            ns = self.store.get(self._type(*NAMESPACES), None, namespace or "")
            if ns is None:
                raise StatusError.of(
                    404,
                    f'namespaces "{namespace}" not found',
                    details={"name": namespace, "kind": "namespaces"},
                )
            if ns["metadata"].get("deletionTimestamp"):
                raise StatusError.of(
                    403,
                    f'{rt.kind.lower()} "{meta["name"]}" is forbidden: unable to create '
                    f"new content in namespace {namespace} because it is being terminated",
                )
        if self.store.get(rt, namespace, meta["name"]) is not None:
            raise StatusError.of(
                409,
                f'{rt.qualified} "{meta["name"]}" already exists',
                reason="AlreadyExists",
                details=self._details(rt, meta["name"]),
            )
        new_type = self._crd_type(obj) if rt.key == CRDS else None
        created = self.store.insert(rt, obj)
        if new_type is not None:
            self._establish(new_type, created)
        self._settle()
        return self._served(rt, created, version)

    def update(self, rt: ResourceType, version: str, route: Route, old: Obj, new: Any) -> Obj:
        """Write a new state given by PUT or by a patch applied to `old`, with the API server's checks."""
        if not isinstance(new, dict):
            raise StatusError.of(400, "the body of the request is not a JSON object")
        new = self._with_type_meta(rt, version, new)
        meta = new["metadata"] = dict(new.get("metadata") or {})
        old_meta = old["metadata"]
        for key in ("name", "namespace") if rt.namespaced else ("name",):
            sent = meta.get(key)
            if sent and sent != old_meta.get(key):
                raise StatusError.of(
                    400,
                    f"the {key} of the object ({sent}) does not match the {key} on the URL "
                    f"({old_meta.get(key)})",
                )
            if old_meta.get(key):
                meta[key] = old_meta[key]
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != old_meta["resourceVersion"]:
            raise StatusError.of(
                409,
                f'Operation cannot be fulfilled on {rt.qualified} "{meta["name"]}": the object '
                "has been modified; please apply your changes to the latest version and try again",
                details=self._details(rt, meta["name"]),
            )
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise StatusError.of(
                409,
                f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                f"{old_meta['uid']}",
                details=self._details(rt, meta["name"]),
            )
        for key in _SYSTEM_FIELDS:
            meta.pop(key, None)
            if key in old_meta:
                meta[key] = old_meta[key]
        if route.subresource == "status":  # only status may change; metadata changes are ignored
            new = {
                **{k: v for k, v in old.items() if k != "status"},
                **({"status": new["status"]} if "status" in new else {}),
            }
        elif rt.has_status:  # the main resource cannot change status
            new = {
                **{k: v for k, v in new.items() if k != "status"},
                **({"status": old["status"]} if "status" in old else {}),
            }
        added = set(new["metadata"].get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
        if old_meta.get("deletionTimestamp") and added:
            raise invalid(
                rt.kind,
                rt.group,
                meta["name"],
                [
                    FieldError.forbidden(
                        "metadata.finalizers", "no new finalizers can be added if the object is being deleted"
                    )
                ],
            )
        new = self._admit(rt, version, new, old)
        new_type = self._crd_type(new) if rt.key == CRDS else None
        updated = self.store.update(rt, old, new)
        if new_type is not None:
            self.registry.add(new_type)
        self._settle()
        return self._served(rt, updated, version)

    def delete(self, rt: ResourceType, version: str, old: Obj, options: dict[str, Any]) -> tuple[Obj, bool]:
        preconditions = options.get("preconditions") or {}
        for key in ("uid", "resourceVersion"):
            if preconditions.get(key) and preconditions[key] != old["metadata"][key]:
                raise StatusError.of(
                    409,
                    f"Precondition failed: {key} in precondition: {preconditions[key]}, "
                    f"{key} in object meta: {old['metadata'][key]}",
                    details=self._details(rt, old["metadata"]["name"]),
                )
        if options.get("dryRun"):
            raise StatusError.of(400, "dryRun is not supported by the test API server")
        policy = options.get("propagationPolicy") or "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            raise StatusError.of(400, f"unsupported propagationPolicy: {policy}")
        result, gone = self.store.delete(rt, old, policy)
        self._settle()
        return self._served(rt, result, version), gone

    # -- HTTP ---------------------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        route = Route.parse(raw.path)
        if route is None:
            return await super().__call__(raw)  # discovery, /version and scripted reactions: kmock's own
        body = await raw.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        request = kmock.Request(
            id=len(self._requests),
            method=raw.method,
            url=raw.url,
            params=dict(raw.query),
            headers=dict(raw.headers),
            body=body,
            text=body.decode(errors="replace"),
            data=data,
            raw_request=raw,
            resource=kmock.resource(route.group, route.version, route.plural),
            namespace=route.namespace,
            name=route.name,
            subresource=route.subresource,
        )
        self._requests.append(request)
        try:
            verb = route.verb(raw.method, request.params)
            object.__setattr__(request, "action", _ACTIONS.get(verb))  # for kmock's request filters
            if body and data is None:
                raise StatusError.of(400, "the body of the request could not be decoded as JSON")
            return await self._serve(request, route, verb, raw)
        except StatusError as e:
            return aiohttp.web.json_response(e.body(), status=e.status, headers=e.headers())
        except Exception as e:  # a bug of this server: keep it for the fixture to report at teardown
            if self._errors:
                self._errors[-1].append(e)
            return await self._render_error(e)

    async def _serve(
        self, request: kmock.Request, route: Route, verb: str, raw: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        rt = self.registry.get(route.group, route.plural, route.version)
        if rt is None:
            raise StatusError.of(404, "the server could not find the requested resource")
        fault = self.faults.take(verb, rt.group, rt.plural, route.subresource)
        if fault is not None:
            await asyncio.sleep(fault.delay)
            if fault.status is not None:
                raise StatusError.of(
                    fault.status,
                    fault.message or f"injected fault: {verb} {rt.qualified}",
                    retry_after=fault.retry_after,
                )
        if verb not in rt.verbs or verb == "deletecollection":
            raise StatusError.of(
                405, f"the server does not allow this method on the requested resource: {verb}"
            )
        if (rt.namespaced and route.namespace is None and verb not in ("list", "watch")) or (
            not rt.namespaced and route.namespace is not None
        ):
            raise StatusError.of(404, "the server could not find the requested resource")
        if route.subresource is not None and (
            route.subresource != "status" or not rt.has_status or verb not in ("get", "update", "patch")
        ):
            raise StatusError.of(404, "the server could not find the requested resource")
        if verb == "watch":
            return await self._watch(rt, route, request.params, raw)
        if verb == "list":
            return aiohttp.web.json_response(self._list(rt, route, request.params))
        if verb == "create":
            return aiohttp.web.json_response(
                self.create(rt, route.version, route.namespace, request.data), status=201
            )
        old = self._existing(rt, route)
        if verb == "get":
            return aiohttp.web.json_response(self._served(rt, old, route.version))
        if verb == "update":
            return aiohttp.web.json_response(self._replace(rt, route, old, request.data))
        if verb == "patch":
            return aiohttp.web.json_response(self._patch(rt, route, old, request))
        options = dict(request.data or {}) if isinstance(request.data, dict) else {}
        options.update({k: v for k, v in request.params.items() if k in ("propagationPolicy", "dryRun")})
        result, gone = self.delete(rt, route.version, old, options)
        if not gone:
            return aiohttp.web.json_response(result, status=202)  # finalizers pending
        if rt.custom:
            return aiohttp.web.json_response(result)
        details = {**self._details(rt, route.name), "uid": result["metadata"]["uid"]}
        return aiohttp.web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
        )

    def _replace(self, rt: ResourceType, route: Route, old: Obj, data: Any) -> Obj:
        if isinstance(data, dict) and rt.custom and not (data.get("metadata") or {}).get("resourceVersion"):
            raise invalid(
                rt.kind,
                rt.group,
                route.name or "",
                [FieldError.invalid("metadata.resourceVersion", 0, "must be specified for an update")],
            )
        return self.update(rt, route.version, route, old, data)

    def _patch(self, rt: ResourceType, route: Route, old: Obj, request: kmock.Request) -> Obj:
        media = (
            {k.lower(): v for k, v in request.headers.items()}.get("content-type", "").split(";")[0].strip()
        )
        base = self._served(rt, old, route.version)
        if media == "application/json-patch+json":
            if not isinstance(request.data, list):
                raise StatusError.of(400, "a JSON patch must be a list of operations")
            try:
                new = jsonpatch.apply_patch(base, request.data, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                raise StatusError.of(422, str(e), details=self._details(rt, route.name or "")) from None
        elif media == "application/merge-patch+json" or (
            media == "application/strategic-merge-patch+json" and not rt.custom
        ):
            if not isinstance(request.data, dict):
                raise StatusError.of(400, "a merge patch must be a JSON object")
            new = merge_patch(base, request.data)
        else:
            raise StatusError.of(
                415,
                f"the body of the request was in an unknown format ({media}) - accepted media "
                f"types include: {_MEDIA_TYPES} (server-side apply is not emulated)",
            )
        return self.update(rt, route.version, route, old, new)

    def _list(self, rt: ResourceType, route: Route, params: dict[str, str]) -> Obj:
        labels, fields = self._selectors(params)
        items = [o for o in self.store.items(rt, route.namespace) if selectors.matches(o, labels, fields)]
        metadata: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        if params.get("continue"):
            try:
                after = json.loads(base64.urlsafe_b64decode(params["continue"]))
            except ValueError:
                raise StatusError.of(400, "invalid continue token") from None
            metadata["resourceVersion"] = after.pop()
            items = [o for o in items if _sort_key(o) > tuple(after)]
        limit = int(params.get("limit") or 0)
        if limit and len(items) > limit:
            token = [*_sort_key(items[limit - 1]), metadata["resourceVersion"]]
            metadata.update(
                {
                    "continue": base64.urlsafe_b64encode(json.dumps(token).encode()).decode(),
                    "remainingItemCount": len(items) - limit,
                }
            )
            items = items[:limit]
        return {
            "apiVersion": rt.api_version(route.version),
            "kind": f"{rt.kind}List",
            "metadata": metadata,
            "items": [self._served(rt, o, route.version) for o in items],
        }

    async def _watch(
        self, rt: ResourceType, route: Route, params: dict[str, str], raw: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        labels, fields = self._selectors(params)
        if route.name:  # the old-style watch of one object: /watch on a named URL
            fields.append(selectors.Requirement("metadata.name", "=", frozenset({route.name})))
        since = params.get("resourceVersion") or "0"
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        if not since.isdigit():
            raise StatusError.of(400, f"invalid resourceVersion: {since!r}")

        def visible(obj: Obj) -> bool:
            namespace = obj["metadata"].get("namespace")
            return (route.namespace is None or namespace == route.namespace) and selectors.matches(
                obj, labels, fields
            )

        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(raw)
        try:
            async for event in self.store.watch(rt, int(since) or None, visible, timeout):
                if event["type"] != "ERROR":
                    event = {**event, "object": self._served(rt, event["object"], route.version)}
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        return response

    # -- helpers ------------------------------------------------------------------------------------

    def _type(self, group: str, plural: str) -> ResourceType:
        rt = self.registry.get(group, plural)
        assert rt is not None, f"builtin resource {plural} is not registered"
        return rt

    def _existing(self, rt: ResourceType, route: Route) -> Obj:
        obj = self.store.get(rt, route.namespace, route.name or "")
        if obj is None:
            raise StatusError.of(
                404, f'{rt.qualified} "{route.name}" not found', details=self._details(rt, route.name)
            )
        return obj

    @staticmethod
    def _details(rt: ResourceType, name: str | None) -> dict[str, str]:
        return {"name": name or "", "group": rt.group, "kind": rt.plural}

    @staticmethod
    def _served(rt: ResourceType, obj: Obj, version: str) -> Obj:
        """The object as a given version shows it (only apiVersion differs: no conversion webhooks)."""
        api_version = rt.api_version(version)
        return obj if obj.get("apiVersion") == api_version else {**obj, "apiVersion": api_version}

    @staticmethod
    def _with_type_meta(rt: ResourceType, version: str, obj: Obj) -> Obj:
        """Check apiVersion/kind against the URL and return a shallow copy in the storage version."""
        expected = rt.api_version(version)
        if rt.custom and not (obj.get("apiVersion") and obj.get("kind")):
            raise StatusError.of(400, "Object 'Kind' is missing in the request body")
        if obj.get("apiVersion", expected) != expected:
            raise StatusError.of(
                400,
                f"the API version in the data ({obj['apiVersion']}) does not match the "
                f"expected API version ({expected})",
            )
        if obj.get("kind", rt.kind) != rt.kind:
            raise StatusError.of(
                400, f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})"
            )
        return {**obj, "apiVersion": rt.api_version(), "kind": rt.kind}

    @staticmethod
    def _selectors(params: dict[str, str]) -> tuple[list[selectors.Requirement], list[selectors.Requirement]]:
        try:
            return selectors.parse_labels(params.get("labelSelector", "")), selectors.parse_fields(
                params.get("fieldSelector", "")
            )
        except ValueError as e:
            raise StatusError.of(400, str(e)) from None

    def _admit(self, rt: ResourceType, version: str, obj: Obj, old: Obj | None) -> Obj:
        """Validate metadata for every resource and the schema (with defaults and pruning) for CRs."""
        meta = obj["metadata"]
        errors = _metadata_errors(rt, meta)
        if rt.custom:
            schema = rt.schemas[version]
            obj = structural.normalize(obj, schema)
            old_obj = self._served(rt, old, version) if old is not None else structural.MISSING
            errors += structural.validate(obj, schema, old_obj)
        if errors:
            raise invalid(rt.kind, rt.group, meta.get("name", ""), errors)
        return obj

    def _crd_type(self, crd: Obj) -> ResourceType:
        try:
            return resource_type_from_crd(crd)
        except CRDInvalidError as e:
            raise invalid(
                "CustomResourceDefinition", CRDS[0], crd["metadata"].get("name", ""), e.errors
            ) from None

    def _establish(self, new_type: ResourceType, crd: Obj) -> None:
        """What the apiextensions controllers do: serve the resource and report it as Established."""
        self.registry.add(new_type)
        conditions = [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ]
        status = {
            "conditions": [{**c, "lastTransitionTime": now()} for c in conditions],
            "acceptedNames": crd["spec"]["names"],
            "storedVersions": [new_type.storage_version],
        }
        self.store.update(self._type(*CRDS), crd, {**crd, "status": status})

    def _settle(self) -> None:
        """Let the controllers catch up: garbage collection, and unserving the resources of deleted CRDs."""
        while True:
            self.store.collect_garbage()
            crds = self._type(*CRDS)
            gone = [
                rt
                for rt in self.registry
                if rt.custom and self.store.get(crds, None, rt.crd_name or "") is None
            ]
            if not gone:
                return
            for rt in gone:
                self.store.purge(rt)
                self.registry.remove(rt.key)

    # -- discovery (kmock's, made deterministic: preferred version first, as Kubernetes orders them) ---

    def _get_resources(self) -> list[kmock.resource]:
        return list(self._resources)  # not kmock's guesses from stored objects, which outlive their CRDs

    async def _serve_apis(self, request: kmock.Request) -> kmock.Payload:
        return {
            "apiVersion": "v1",
            "kind": "APIGroupList",
            "groups": [
                self._group_document(group)
                for group in sorted({rt.group for rt in self.registry if rt.group})
            ],
        }

    async def _serve_group(self, request: kmock.Request) -> kmock.Payload:
        group = request.resource.group if request.resource else None
        if not any(rt.group == group for rt in self.registry):
            raise StatusError.of(404, "the server could not find the requested resource")
        return {"apiVersion": "v1", **self._group_document(group or "")}

    def _group_document(self, group: str) -> dict[str, Any]:
        versions = sorted(
            {v for rt in self.registry if rt.group == group for v in rt.versions}, key=version_priority
        )
        documents = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "name": group, "versions": documents, "preferredVersion": documents[0]}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _sort_key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace") or "", obj["metadata"]["name"]


def _metadata_errors(rt: ResourceType, meta: dict[str, Any]) -> list[FieldError]:
    """The ObjectMeta checks every resource gets: names, labels and owner references."""
    errors: list[FieldError] = []
    name = meta.get("name")
    if not name:
        return [FieldError.required("metadata.name", "name or generateName is required")]
    if rt.key == NAMESPACES and not (_LABEL.fullmatch(name) and len(name) <= 63):
        errors.append(
            FieldError.invalid(
                "metadata.name",
                name,
                "a lowercase RFC 1123 label must consist of lower "
                "case alphanumeric characters or '-', and must start and end with an "
                "alphanumeric character",
            )
        )
    elif rt.group != "rbac.authorization.k8s.io" and not (_SUBDOMAIN.fullmatch(name) and len(name) <= 253):
        errors.append(
            FieldError.invalid(
                "metadata.name",
                name,
                "a lowercase RFC 1123 subdomain must consist of "
                "lower case alphanumeric characters, '-' or '.', and must start and end "
                "with an alphanumeric character",
            )
        )
    for key, value in (meta.get("labels") or {}).items():
        if not (_LABEL_KEY.fullmatch(key) and len(key.rpartition("/")[2]) <= 63):
            errors.append(
                FieldError.invalid(
                    "metadata.labels",
                    key,
                    "a valid label key must be an optional "
                    "DNS subdomain prefix and '/' and a name of at most 63 characters",
                )
            )
        if not isinstance(value, str) or not _LABEL_VALUE.fullmatch(value) or len(value) > 63:
            errors.append(
                FieldError.invalid(
                    "metadata.labels",
                    value,
                    "a valid label must be an empty string or "
                    "at most 63 alphanumeric characters, '-', '_' or '.', starting and "
                    "ending with an alphanumeric character",
                )
            )
    for index, ref in enumerate(meta.get("ownerReferences") or ()):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                errors.append(FieldError.required(f"metadata.ownerReferences[{index}].{key}"))
    return errors
