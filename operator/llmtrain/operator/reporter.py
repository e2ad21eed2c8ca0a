"""The namespace's reporter Role and RoleBinding, ensured before a job of the namespace starts.

Level-triggered and cheap: a reconcile that needs them reads both (read first, as every child:
a create in a namespace at its ResourceQuota is refused 403 even when the object exists) and
creates what is missing; a namespace found complete is remembered for `VERIFY_SECONDS`, so a
burst of jobs costs two reads per namespace, not per job, and one deleted by hand is created
again by the next reconcile or resync pass after that. The resync pass forgets them all first.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from llmtrain.constants import MANAGED_BY_LABEL, OPERATOR_NAME
from llmtrain.operator.children import OwnershipConflict, read_child
from llmtrain.operator.kube import ApiError, Kube, resource_of
from llmtrain.render.rbac import render_reporter_rbac

# How long a namespace found complete is trusted before it is read again.
VERIFY_SECONDS = 60.0
# The fields the operator puts back on its reporter objects (an edit by hand is undone).
_SYNCED = {"Role": "rules", "RoleBinding": "subjects"}


class ReporterRbac:
    """Which namespaces have their reporter Role and RoleBinding, as last read."""

    def __init__(self, verify_seconds: float = VERIFY_SECONDS) -> None:
        self._verify = verify_seconds
        self._checked: dict[str, float] = {}
        # One ensure per namespace at a time: a burst's first jobs wait for the first one's reads
        # and creates instead of each racing it to a 409.
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def forget(self) -> None:
        with self._guard:
            self._checked.clear()

    def ensure(self, kube: Kube, namespace: str) -> list[str]:
        """Read both, create or put back what is missing or changed; the Kind/name of each write.
        Raises OwnershipConflict when the name is taken by an object llmtrain did not make."""
        with self._guard:
            lock = self._locks.setdefault(namespace, threading.Lock())
        with lock:
            with self._guard:
                checked = self._checked.get(namespace)
            if checked is not None and time.monotonic() - checked < self._verify:
                return []
            written = [w for desired in render_reporter_rbac(namespace) if (w := _ensure_one(kube, desired))]
            with self._guard:
                self._checked[namespace] = time.monotonic()
            return written


def _ensure_one(kube: Kube, desired: dict[str, Any]) -> str | None:
    meta, kind = desired["metadata"], desired["kind"]
    key = f"{kind}/{meta['name']}"
    existing = read_child(kube, desired)
    if existing is None:
        try:
            kube.create(desired)
            return f"created {key}"
        except ApiError as err:
            if err.status != 409:
                raise
            existing = read_child(kube, desired)  # another replica or reconcile made it meanwhile
            if existing is None:
                raise
    labels = existing["metadata"].get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != OPERATOR_NAME:
        raise OwnershipConflict(
            f"{key} in namespace {meta['namespace']} exists but was not created by llmtrain (no label "
            f"{MANAGED_BY_LABEL}={OPERATOR_NAME}): llmtrain never takes it over, and the job's trainer "
            "reports its progress through it. Delete or rename it"
        )
    if kind == "RoleBinding" and existing.get("roleRef") != desired["roleRef"]:
        raise OwnershipConflict(
            f"{key} in namespace {meta['namespace']} refers to another role ({existing.get('roleRef')}); "
            "a binding's roleRef cannot change: delete it and llmtrain makes it again"
        )
    field = _SYNCED[kind]
    if existing.get(field) == desired[field]:
        return None
    kube.merge_patch(resource_of(desired), meta["namespace"], meta["name"], {field: desired[field]})
    return f"put back {key}"


REPORTER_RBAC = ReporterRbac()
