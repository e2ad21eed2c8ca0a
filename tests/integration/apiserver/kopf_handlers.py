"""A trivial Kopf operator for test_apiserver_kopf.py: one create and one delete handler for widgets.

It keeps Kopf's bookkeeping in `status` (as the project's operator will), so every status write goes
through the server's status subresource.
"""

from __future__ import annotations

from typing import Any

import kopf

calls: list[tuple[str, str]] = []  # (handler, object name), read by the test in the same process


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field="status.kopf.lastHandled")


@kopf.on.create("example.com", "v1", "widgets")
def created(name: str, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
    calls.append(("create", name))
    patch.status["phase"] = "Ready"
    patch.status["observedSize"] = spec["size"]


@kopf.on.delete("example.com", "v1", "widgets")
def deleted(name: str, **_: Any) -> None:
    calls.append(("delete", name))
