"""A small synchronous Kubernetes REST adapter over the official client's transport.

Handlers deal in plain dicts (what `render()` returns), so this speaks JSON to the API by path
instead of going through the generated models. Kopf runs sync handlers in its thread pool.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from llmtrain.constants import (
    API_GROUP,
    API_VERSION,
    GROUP_VERSION,
    KIND,
    PLURAL,
    RAY_API_GROUP,
    RAY_API_VERSION,
    RAY_GROUP_VERSION,
    RAYJOB_KIND,
    RAYJOB_PLURAL,
)

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        """The object's (or, without a name, the collection's) path; no namespace: every namespace."""
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}" if namespace else f"{base}/{self.plural}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path


RESOURCES: dict[tuple[str, str], Resource] = {
    ("v1", "ConfigMap"): Resource("", "v1", "configmaps"),
    ("v1", "PersistentVolumeClaim"): Resource("", "v1", "persistentvolumeclaims"),
    ("v1", "ServiceAccount"): Resource("", "v1", "serviceaccounts"),
    ("v1", "Event"): Resource("", "v1", "events"),
    ("v1", "Pod"): Resource("", "v1", "pods"),
    ("v1", "Node"): Resource("", "v1", "nodes"),
    ("rbac.authorization.k8s.io/v1", "Role"): Resource("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): Resource(
        "rbac.authorization.k8s.io", "v1", "rolebindings"
    ),
    (RAY_GROUP_VERSION, RAYJOB_KIND): Resource(RAY_API_GROUP, RAY_API_VERSION, RAYJOB_PLURAL),
    (GROUP_VERSION, KIND): Resource(API_GROUP, API_VERSION, PLURAL),
}


def resource_of(obj: dict[str, Any]) -> Resource:
    return RESOURCES[(obj["apiVersion"], obj["kind"])]


class ApiError(Exception):
    """A non-2xx answer; `retry_after` is the server's Retry-After (seconds) when it sent one."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        super().__init__(f"HTTP {status} {reason}: {message}")

    @property
    def transient(self) -> bool:
        """Worth retrying: conflicts, throttling, server errors and timeouts."""
        return self.status in (409, 429) or self.status >= 500 or self.status == 0

    @property
    def refused_for_now(self) -> bool:
        """Refused for a reason that can pass without the spec changing: a ResourceQuota that is
        full (403), RBAC or a namespace still being set up or torn down (403), a CRD not installed
        yet (404 on create). Worth retrying with backoff, unlike an invalid object (400, 422)."""
        return self.status in (403, 404)


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object ({} when empty); None when it is not one, e.g. a proxy's HTML 502."""
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def load_config() -> None:
    """The kubernetes client's default configuration: in a pod the ServiceAccount, elsewhere
    $KUBECONFIG or ~/.kube/config."""
    from kubernetes import config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]


class Kube:
    def __init__(self, api: k8s_client.ApiClient | None = None) -> None:
        self.api = api or k8s_client.ApiClient()

    @classmethod
    def from_environment(cls, connections: int = 10) -> Kube:
        """In a pod: the ServiceAccount; elsewhere: $KUBECONFIG or ~/.kube/config.

        `connections` should match the handler threads: with fewer pooled connections than threads,
        threads queue on urllib3's pool lock instead of on the API server.
        """
        load_config()
        configuration = k8s_client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = connections
        return cls(k8s_client.ApiClient(configuration))

    def request(
        self, method: str, path: str, body: Any = None, content_type: str | None = None
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        m, url, hdrs, payload, _ = self.api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api.call_api(m, url, header_params=hdrs, body=payload, _request_timeout=30)
            raw = resp.read()  # type: ignore[no-untyped-call]
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            # Refused, reset, timed out, or cut off mid-body: urllib3 wraps most of these in its own
            # errors (MaxRetryError, ProtocolError, ReadTimeoutError), which are not OSErrors.
            raise ApiError(0, "ConnectionError", f"{type(exc).__name__}: {exc}") from exc
        except ApiException as exc:  # the client's wrapping of a TLS failure (status 0)
            raise ApiError(exc.status or 0, str(exc.reason or "ConnectionError"), str(exc)) from exc
        data = _json_object(raw)
        if resp.status >= 300:
            retry_after = resp.getheader("Retry-After")  # type: ignore[no-untyped-call]
            raise ApiError(
                resp.status,
                str((data or {}).get("reason") or resp.reason),
                str((data or {}).get("message") or raw[:500].decode("utf-8", "replace")),
                float(retry_after) if retry_after else None,
            )
        if data is None:  # a 2xx that is not the API server's JSON: an intermediary's page
            raise ApiError(0, "InvalidResponse", f"not JSON: {raw[:200].decode('utf-8', 'replace')}")
        return data

    def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any]:
        return self.request("GET", res.path(namespace, name))

    def list_all(
        self,
        res: Resource,
        namespace: str | None,
        label_selector: str | None = None,
        page: int = 500,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every object of a collection (paged), in one namespace or all (None)."""
        return [
            obj
            for chunk in self.list_pages(res, namespace, label_selector, page, field_selector)
            for obj in chunk
        ]

    def list_pages(
        self,
        res: Resource,
        namespace: str | None,
        label_selector: str | None = None,
        page: int = 500,
        field_selector: str | None = None,
    ) -> Iterator[list[dict[str, Any]]]:
        """A collection one page (`limit`/`continue`) at a time, so a caller that handles each page
        before asking for the next holds one page of bodies, however many objects there are."""
        token = ""
        while True:
            query = {"limit": str(page)}
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            if token:
                query["continue"] = token
            data = self.request("GET", f"{res.path(namespace)}?{urllib.parse.urlencode(query)}")
            yield data.get("items") or []
            token = (data.get("metadata") or {}).get("continue") or ""
            if not token:
                return

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = resource_of(obj)
        return self.request("POST", res.path(obj["metadata"]["namespace"]), obj)

    def merge_patch(
        self, res: Resource, namespace: str, name: str, patch: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        return self.request("PATCH", res.path(namespace, name, subresource), patch, MERGE_PATCH)

    def json_patch(
        self,
        res: Resource,
        namespace: str,
        name: str,
        ops: list[dict[str, Any]],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        return self.request("PATCH", res.path(namespace, name, subresource), ops, JSON_PATCH)
