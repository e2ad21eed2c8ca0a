"""A trivial Kopf operator for test_apiserver_kopf.py: one create and one delete handler for widgets.

It keeps Kopf's bookkeeping in `status` (as the project's operator will), so every status write goes
through the server's status subresource.
"""

from __future__ import annotations

from typing import Any

import kopf

calls: list[tuple[str, str]] = []  # (handler, object name), read by the test in the same process
# Its own registry: Kopf's default one is process-wide and also holds the project operator's handlers
# once another test has imported them (their start-up handler sets another finalizer name).
registry = kopf.OperatorRegistry()


@kopf.on.login(registry=registry)
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """What the default registry does: the kubeconfig the fixture wrote, through the kubernetes client."""
    return kopf.login_via_client(**kwargs)


@kopf.on.startup(registry=registry)
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field="status.kopf.lastHandled")


@kopf.on.create("example.com", "v1", "widgets", registry=registry)
def created(name: str, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
    calls.append(("create", name))
    patch.status["phase"] = "Ready"
    patch.status["observedSize"] = spec["size"]


@kopf.on.delete("example.com", "v1", "widgets", registry=registry)
def deleted(name: str, **_: Any) -> None:
    calls.append(("delete", name))
