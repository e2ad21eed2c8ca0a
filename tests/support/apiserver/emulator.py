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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock

from tests.support.apiserver import selectors
from tests.support.apiserver.errors import FieldError, StatusError, invalid
from tests.support.apiserver.faults import Faults
from tests.support.apiserver.lifecycle import Lifecycle, details, served
from tests.support.apiserver.registry import Registry, ResourceType, kmock_resource, version_priority
from tests.support.apiserver.store import Obj, Store

T = TypeVar("T")
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

    def verb(self, method: str, params: Mapping[str, str]) -> str | None:
        """The Kubernetes verb (as RBAC names it), or None for a method the URL does not allow."""
        if method == "GET":
            return "watch" if params.get("watch") in ("true", "1") else "get" if self.name else "list"
        if method == "DELETE" and not self.name:
            return "deletecollection"
        if method == "POST":
            return None if self.name else "create"
        verbs = {"PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        return verbs.get(method) if self.name else None


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
    lifecycle: Lifecycle = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.registry = Registry(self.resources)
        self.registry.load_builtins()
        self.store = Store(self.objects, self.registry)
        self.lifecycle = Lifecycle(self.registry, self.store)

    # -- HTTP ---------------------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        route = Route.parse(raw.path)
        if route is None and raw.method != "GET" and raw.path.startswith(("/api/", "/apis/")):
            # kmock would take e.g. a POST to /apis/<group>/<version> for an object write and fail on it
            refusal = StatusError.of(405, f"the server does not allow this method on {raw.path}")
            return aiohttp.web.json_response(refusal.body(), status=405)
        if route is None:
            return await super().__call__(raw)  # discovery, /version and scripted reactions: kmock's own
        body = await raw.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        verb = route.verb(raw.method, raw.query)
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
            resource=kmock_resource(route.group, route.version, route.plural),
            namespace=route.namespace,
            name=route.name,
            subresource=route.subresource,
            action=_ACTIONS.get(verb or ""),  # for kmock's request filters, e.g. emulator["patch"]
        )
        self._requests.append(request)  # kmock's request log
        try:
            if verb is None:
                raise StatusError.of(405, f"the server does not allow {raw.method} on {raw.path}")
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
                self.lifecycle.create(rt, route.version, route.namespace, request.data), status=201
            )
        old = self._existing(rt, route)
        if verb == "get":
            return aiohttp.web.json_response(served(rt, old, route.version))
        if verb == "update":
            return aiohttp.web.json_response(self._replace(rt, route, old, request.data))
        if verb == "patch":
            return aiohttp.web.json_response(self._patch(rt, route, old, request))
        options = dict(request.data or {}) if isinstance(request.data, dict) else {}
        options.update({k: v for k, v in request.params.items() if k in ("propagationPolicy", "dryRun")})
        result, gone = self.lifecycle.delete(rt, route.version, old, options)
        if not gone:
            return aiohttp.web.json_response(result, status=202)  # finalizers pending
        if rt.custom:
            return aiohttp.web.json_response(result)
        gone_details = {**details(rt, route.name), "uid": result["metadata"]["uid"]}
        return aiohttp.web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": gone_details,
            }
        )

    def _replace(self, rt: ResourceType, route: Route, old: Obj, data: Any) -> Obj:
        if isinstance(data, dict) and rt.custom and not (data.get("metadata") or {}).get("resourceVersion"):
            raise invalid(
                rt.kind,
                rt.group,
                route.name or "",
                [FieldError.invalid("metadata.resourceVersion", 0, "must be specified for an update")],
            )
        return self.lifecycle.update(rt, route.version, route.subresource, old, data)

    def _patch(self, rt: ResourceType, route: Route, old: Obj, request: kmock.Request) -> Obj:
        media = (
            {k.lower(): v for k, v in request.headers.items()}.get("content-type", "").split(";")[0].strip()
        )
        base = served(rt, old, route.version)
        if media == "application/json-patch+json":
            if not isinstance(request.data, list):
                raise StatusError.of(400, "a JSON patch must be a list of operations")
            try:
                new = jsonpatch.apply_patch(base, request.data, in_place=False)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
                raise StatusError.of(422, str(e), details=details(rt, route.name or "")) from None
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
        return self.lifecycle.update(rt, route.version, route.subresource, old, new)

    def _list(self, rt: ResourceType, route: Route, params: Mapping[str, str]) -> Obj:
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
        limit = _number(params, "limit", int) or 0
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
            "items": [served(rt, o, route.version) for o in items],
        }

    async def _watch(
        self, rt: ResourceType, route: Route, params: Mapping[str, str], raw: aiohttp.web.BaseRequest
    ) -> aiohttp.web.StreamResponse:
        labels, fields = self._selectors(params)
        if route.name:  # the old-style watch of one object: /watch on a named URL
            fields.append(selectors.Requirement("metadata.name", "=", frozenset({route.name})))
        since = params.get("resourceVersion") or "0"
        timeout = _number(params, "timeoutSeconds", float)
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
                    event = {**event, "object": served(rt, event["object"], route.version)}
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        return response

    # -- helpers ------------------------------------------------------------------------------------

    def _existing(self, rt: ResourceType, route: Route) -> Obj:
        obj = self.store.get(rt, route.namespace, route.name or "")
        if obj is None:
            raise StatusError.of(
                404, f'{rt.qualified} "{route.name}" not found', details=details(rt, route.name)
            )
        return obj

    @staticmethod
    def _selectors(
        params: Mapping[str, str],
    ) -> tuple[list[selectors.Requirement], list[selectors.Requirement]]:
        try:
            return selectors.parse_labels(params.get("labelSelector", "")), selectors.parse_fields(
                params.get("fieldSelector", "")
            )
        except ValueError as e:
            raise StatusError.of(400, str(e)) from None

    # -- discovery (kmock's, made deterministic: preferred version first, as Kubernetes orders them) ---

    def _get_resources(self) -> list[kmock.resource]:
        """The served resources only: not kmock's guesses from stored objects, which outlive their CRDs."""
        return cast(list[kmock.resource], list(self._resources))

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


def _number(params: Mapping[str, str], key: str, kind: Callable[[str], T]) -> T | None:
    try:
        return kind(params[key]) if params.get(key) else None
    except ValueError:
        raise StatusError.of(400, f"invalid {key}: {params[key]!r}") from None


def _sort_key(obj: Obj) -> tuple[str, str]:
    return obj["metadata"].get("namespace") or "", obj["metadata"]["name"]
