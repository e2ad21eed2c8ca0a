"""A running test API server: the emulator in its own thread and event loop, plus a small async client.

The server runs in a thread, not in the test's event loop, so that blocking clients work against it:
the official `kubernetes` client, `time.sleep()` in a test, or KopfRunner's exit (which joins the
operator's thread) cannot starve it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import aiohttp
import kmock

from tests.support.apiserver.emulator import Emulator
from tests.support.apiserver.faults import Faults
from tests.support.apiserver.registry import ResourceType

T = TypeVar("T")
Obj = dict[str, Any]
Patch = Obj | list[Obj]  # a merge patch, or a JSON patch (a list of operations)

PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}


class Response(NamedTuple):
    status: int
    body: Any
    headers: dict[str, str]


class ApiError(Exception):
    """A non-2xx answer; `status` is the HTTP code and `body` the parsed `Status` object."""

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.body = body
        self.headers = headers or {}

    @property
    def reason(self) -> str | None:
        return self.body.get("reason") if isinstance(self.body, dict) else None

    @property
    def causes(self) -> list[dict[str, str]]:
        return (self.body.get("details") or {}).get("causes") or [] if isinstance(self.body, dict) else []


class ApiServer:
    """Start with `start()`, stop with `await aclose()`; the `apiserver` fixture does both."""

    def __init__(self) -> None:
        self.url = ""
        self.kubeconfig: Path | None = None
        self._emulator: Emulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-apiserver", daemon=True)
        self._failure: BaseException | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self, timeout: float = 10) -> None:
        self._thread.start()
        if not self._ready.wait(timeout) or self._failure is not None:
            raise RuntimeError("the test API server did not start") from self._failure

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self.emulator.store.close)
            self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join, 10)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start()
            self._failure = e
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._emulator = Emulator()
        async with self._emulator, kmock.Server(self._emulator) as server:
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    # -- direct access (runs in the server's thread, so it is safe from any thread) ------------------

    @property
    def emulator(self) -> Emulator:
        """The kmock emulator: `.objects` (with history), the request log (iterate it), reactions.

        It lives in the server's thread: read it through `call()`.
        """
        assert self._emulator is not None, "the server is not started"
        return self._emulator

    @property
    def faults(self) -> Faults:
        return self.emulator.faults

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` in the server's thread between two requests, and return its result."""
        assert self._loop is not None, "the server is not started"
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as e:
                future.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout=10)

    def resource(self, api_version: str, kind_or_plural: str) -> ResourceType:
        return self.call(lambda: self.emulator.registry.lookup(api_version, kind_or_plural))

    def stored(self, api_version: str, kind_or_plural: str, namespace: str | None, name: str) -> Obj | None:
        """The stored object (a deep copy), or None; reads the store directly, with no HTTP and no faults."""
        rt = self.resource(api_version, kind_or_plural)
        obj = self.call(lambda: self.emulator.store.get(rt, namespace if rt.namespaced else None, name))
        return copy.deepcopy(obj)

    def stored_items(self, api_version: str, kind_or_plural: str, namespace: str | None = None) -> list[Obj]:
        rt = self.resource(api_version, kind_or_plural)
        return copy.deepcopy(self.call(lambda: self.emulator.store.items(rt, namespace)))

    def requests(self) -> list[kmock.Request]:
        """Every request served so far, oldest first (kmock's log: method, url, headers, data, action)."""
        return self.call(lambda: list(self.emulator))

    def internal_errors(self) -> list[Exception]:
        """Exceptions that were not API errors: bugs of the server, reported by the fixture at teardown."""
        errors = self.call(lambda: list(self.emulator.errors))
        return [e for e in errors if not isinstance(e, kmock.KubernetesError)]

    def compact(self) -> None:
        """Make every earlier resourceVersion too old to watch from (410 Gone), like etcd compaction."""
        self.call(self.emulator.store.compact)

    async def install_crd(self, crd: Obj) -> Obj:
        """Create or replace a CRD; its resources are served (and listed by discovery) on return."""
        return await asyncio.to_thread(self.call, lambda: self.emulator.lifecycle.install_crd(crd))

    # -- HTTP client helpers (run in the test's event loop) -----------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers={"Authorization": "Bearer test"})
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Response:
        """Send one request and return its status, parsed body and headers, whatever the status."""
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type}
        async with self._client().request(
            method, self.url + path, data=data, params=params, headers=headers
        ) as r:
            text = await r.text()
            parsed = json.loads(text) if text.startswith(("{", "[")) else text
            return Response(r.status, parsed, dict(r.headers))

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = await self.request(method, path, **kwargs)
        if response.status >= 400:
            raise ApiError(response.status, response.body, response.headers)
        return response.body

    def path(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The URL path of a collection or object, e.g. `/apis/ray.io/v1/namespaces/default/rayjobs/x`."""
        rt = self.resource(api_version, kind_or_plural)
        root = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        parts = [
            root,
            f"namespaces/{namespace}" if rt.namespaced and namespace else "",
            rt.plural,
            name or "",
            subresource or "",
        ]
        return "/".join(p for p in parts if p)

    async def create(self, obj: Obj, namespace: str | None = None) -> Obj:
        namespace = namespace or (obj.get("metadata") or {}).get("namespace") or "default"
        result: Obj = await self._call("POST", self.path(obj["apiVersion"], obj["kind"], namespace), body=obj)
        return result

    async def get(self, api_version: str, kind_or_plural: str, namespace: str | None, name: str) -> Obj:
        result: Obj = await self._call("GET", self.path(api_version, kind_or_plural, namespace, name))
        return result

    async def list(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Obj:
        """The whole list response (`items`, `metadata.resourceVersion`)."""
        params = {
            k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v
        }
        result: Obj = await self._call(
            "GET", self.path(api_version, kind_or_plural, namespace), params=params
        )
        return result

    async def patch(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str | None,
        name: str,
        patch: Patch,
        *,
        patch_type: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        """A merge patch for a dict, a JSON patch for a list (or say `patch_type`: merge/json/strategic)."""
        media = PATCH_TYPES[patch_type or ("json" if isinstance(patch, list) else "merge")]
        path = self.path(api_version, kind_or_plural, namespace, name, subresource)
        result: Obj = await self._call("PATCH", path, body=patch, content_type=media)
        return result

    async def patch_status(
        self, api_version: str, kind_or_plural: str, namespace: str | None, name: str, patch: Patch
    ) -> Obj:
        return await self.patch(api_version, kind_or_plural, namespace, name, patch, subresource="status")

    async def replace(self, obj: Obj, *, subresource: str | None = None) -> Obj:
        """PUT the whole object (it must carry `metadata.resourceVersion` for custom resources)."""
        meta = obj["metadata"]
        path = self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"], subresource)
        result: Obj = await self._call("PUT", path, body=obj)
        return result

    async def delete(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str | None,
        name: str,
        *,
        propagation_policy: str | None = None,
    ) -> Obj:
        body = {"propagationPolicy": propagation_policy} if propagation_policy else None
        result: Obj = await self._call(
            "DELETE", self.path(api_version, kind_or_plural, namespace, name), body=body
        )
        return result

    async def watch(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: float | None = None,
    ) -> AsyncIterator[Obj]:
        """Yield watch events (`{"type": ..., "object": ...}`) until the server ends the stream."""
        params = {"watch": "true"}
        for key, value in (
            ("resourceVersion", resource_version),
            ("labelSelector", label_selector),
            ("fieldSelector", field_selector),
            ("timeoutSeconds", timeout_seconds),
        ):
            if value is not None:
                params[key] = str(value)
        async with self._client().get(
            self.url + self.path(api_version, kind_or_plural, namespace),
            params=params,
            timeout=aiohttp.ClientTimeout(total=None),
        ) as r:
            if r.status >= 400:
                raise ApiError(r.status, await r.json())
            async for line in r.content:
                if line.strip():
                    yield json.loads(line)

    async def wait_for(
        self,
        api_version: str,
        kind_or_plural: str,
        namespace: str | None,
        name: str,
        predicate: Callable[[Obj | None], bool],
        *,
        timeout: float = 10,
    ) -> Obj | None:
        """Poll the stored object until `predicate(obj_or_None)` holds; fail with the last state if not."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self.stored(api_version, kind_or_plural, namespace, name)
            if predicate(obj):
                return obj
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting on {kind_or_plural} {name}; last: {obj}"
                )
            await asyncio.sleep(0.05)
