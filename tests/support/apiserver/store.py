"""Object storage with resourceVersions, per-resource event logs for watches, and garbage collection.

Every version of an object is kept in kmock's `ObjectsArray` (so tests can read an object's past),
stamped with one cluster-wide resourceVersion counter like etcd's revision. Reads go to an index of
the live objects by resource, by name and by uid, so a request costs the same with 10 or 10,000
objects stored. Every write appends an event to its resource's log; a watch replays the log after its
`resourceVersion`, so nothing is lost or sent twice between a list and the watch that follows it. All
methods except `watch` are synchronous and so atomic on the server's event loop.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import kmock

from tests.support.apiserver.errors import status_body
from tests.support.apiserver.registry import NAMESPACES, Registry, ResourceType

Obj = dict[str, Any]
_FOREGROUND = "foregroundDeletion"


@dataclass(frozen=True)
class Event:
    type: str  # ADDED, MODIFIED, DELETED
    object: Obj
    old: Obj | None  # the previous state, to turn MODIFIED into ADDED/DELETED for selector watches
    rv: int


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    def __init__(self, objects: kmock.ObjectsArray, registry: Registry) -> None:
        self.objects = objects
        self.registry = registry
        self.rv = 1000
        self._events: dict[tuple[str, str], list[Event]] = defaultdict(list)
        self._compacted_rv = 0
        self._wakeup = asyncio.Event()
        self._closed = False
        # The live objects: resource key -> (namespace or "", name) -> object; objects are never mutated.
        self._live: dict[tuple[str, str], dict[tuple[str, str], Obj]] = defaultdict(dict)
        self._uids: dict[str, Obj] = {}
        # Garbage collection scans everything, so it runs only when a write could have given it work:
        # a deletion, a dangling owner reference, or an object held by finalizers (`_terminating`).
        self._gc_due = False
        self._terminating: set[tuple[tuple[str, str], str, str]] = set()

    # -- reads -------------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        obj = self._live[rt.key].get((namespace or "", name))
        return None if obj is None else dict(obj)

    def items(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        """Live objects of a resource (optionally of one namespace), in etcd's key order."""
        objects = self._live[rt.key]
        keys = sorted(k for k in objects if namespace is None or k[0] == namespace)
        return [dict(objects[k]) for k in keys]

    def live(self) -> Iterator[tuple[ResourceType, Obj]]:
        for key, objects in list(self._live.items()):
            rt = self.registry.get(*key)
            if rt is not None:
                for obj in list(objects.values()):
                    yield rt, dict(obj)

    # -- writes ------------------------------------------------------------------------------------

    def insert(self, rt: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"] = dict(obj["metadata"])
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), resourceVersion=self._next_rv())
        if rt.custom:
            meta["generation"] = 1
        key = (rt.storage_key(), meta.get("namespace"), meta["name"])
        if key in self.objects:
            self.objects[key].create(obj)
        else:
            self.objects[key] = obj
        self._index(rt, obj)
        self._log(rt, "ADDED", obj, None)
        return obj

    def update(self, rt: ResourceType, old: Obj, new: Obj) -> Obj:
        """Store a new state of an object; a no-op write changes nothing, not even the resourceVersion."""
        new = {**new, "metadata": {**new["metadata"], "resourceVersion": old["metadata"]["resourceVersion"]}}
        if new == old:
            return old
        if rt.custom and _generation_content(new, rt) != _generation_content(old, rt):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = self._next_rv()
        key = (rt.storage_key(), new["metadata"].get("namespace"), new["metadata"]["name"])
        self.objects[key].history.append(new)
        if new["metadata"].get("deletionTimestamp") and not _blocking_finalizers(rt, new):
            self.objects[key].delete()
            self._unindex(rt, new)
            self._log(rt, "DELETED", new, old)
        else:
            self._index(rt, new)
            self._log(rt, "MODIFIED", new, old)
        return new

    def delete(self, rt: ResourceType, obj: Obj, propagation: str = "Background") -> tuple[Obj, bool]:
        """Delete now, or mark with deletionTimestamp while finalizers remain; True if gone now."""
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return obj, False
        if propagation == "Orphan":
            self._orphan_dependents(meta["uid"])
        finalizers = list(meta.get("finalizers") or [])
        if propagation == "Foreground" and _FOREGROUND not in finalizers:
            finalizers.append(_FOREGROUND)
        marked = {**obj, "metadata": {**meta, "deletionTimestamp": now(), "deletionGracePeriodSeconds": 0}}
        if finalizers:
            marked["metadata"]["finalizers"] = finalizers
        if meta.get("generation"):  # the server counts the start of a deletion as a new generation
            marked["metadata"]["generation"] = meta["generation"] + 1
        if rt.key == NAMESPACES:
            marked["status"] = {**(obj.get("status") or {}), "phase": "Terminating"}
        result = self.update(rt, obj, marked)
        return result, self.get(rt, meta.get("namespace"), meta["name"]) is None

    def compact(self) -> None:
        """Forget history: a watch from an older resourceVersion gets 410 Gone, as after compaction."""
        self._compacted_rv = self.rv

    def collect_garbage(self) -> None:
        """Do synchronously what the garbage collector and namespace controller do eventually.

        Dependents whose owners are all gone (or being deleted in the foreground) are deleted, the
        content of terminating namespaces is deleted, and finalizers the controllers own are released
        when their work is done. Repeats until nothing changes, so chains of owners resolve at once.
        """
        if not self._gc_due and not self._terminating:
            return
        self._gc_due = False
        changed = True
        while changed:
            changed = False
            live = list(self.live())
            by_uid = {obj["metadata"]["uid"]: obj for _, obj in live}
            terminating = {
                o["metadata"]["name"]
                for rt, o in live
                if rt.key == NAMESPACES and o["metadata"].get("deletionTimestamp")
            }
            for rt, obj in live:
                obj = self.get(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"]) or {}
                meta = obj.get("metadata") or {}
                if not meta or meta.get("deletionTimestamp"):
                    changed |= self._release_controller_finalizers(rt, obj, live)
                    continue
                owners = [by_uid.get(ref.get("uid")) for ref in meta.get("ownerReferences") or ()]
                orphaned = bool(owners) and all(
                    o is None or _FOREGROUND in _deleting_finalizers(o) for o in owners
                )
                if orphaned or meta.get("namespace") in terminating:
                    self.delete(rt, obj)
                    changed = True

    def _release_controller_finalizers(
        self, rt: ResourceType, obj: Obj, live: list[tuple[ResourceType, Obj]]
    ) -> bool:
        meta = obj.get("metadata") or {}
        uid, name = meta.get("uid"), meta.get("name")
        if _FOREGROUND in (meta.get("finalizers") or ()) and not any(
            ref.get("uid") == uid and ref.get("blockOwnerDeletion")
            for _, other in live
            for ref in other["metadata"].get("ownerReferences") or ()
        ):
            rest = [f for f in meta["finalizers"] if f != _FOREGROUND]
            self.update(rt, obj, {**obj, "metadata": {**meta, "finalizers": rest}})
            return True
        if (
            rt.key == NAMESPACES
            and "kubernetes" in (obj.get("spec") or {}).get("finalizers", ())
            and not any(other["metadata"].get("namespace") == name for _, other in live)
        ):
            self.update(rt, obj, {**obj, "spec": {**obj["spec"], "finalizers": []}})
            return True
        return False

    def _orphan_dependents(self, uid: str) -> None:
        for rt, obj in list(self.live()):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                kept = [ref for ref in refs if ref.get("uid") != uid]
                self.update(rt, obj, {**obj, "metadata": {**obj["metadata"], "ownerReferences": kept}})

    def purge(self, rt: ResourceType) -> None:
        """Drop every object of a resource whose CRD was deleted (watchers see them DELETED)."""
        for obj in self.items(rt):
            meta = obj["metadata"]
            gone = {**obj, "metadata": {**meta, "resourceVersion": self._next_rv()}}
            self.objects[rt.storage_key(), meta.get("namespace"), meta["name"]].delete()
            self._unindex(rt, obj)
            self._log(rt, "DELETED", gone, obj)

    # -- watching ----------------------------------------------------------------------------------

    async def watch(
        self, rt: ResourceType, since: int | None, visible: Callable[[Obj], bool], timeout: float | None
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events: the current state as ADDED (without `since`), then every later change."""
        log = self._events[rt.key]
        if since is None:
            position = len(log)
            for obj in self.items(rt):
                if visible(obj):
                    yield {"type": "ADDED", "object": obj}
        elif since < self._compacted_rv:
            message = f"too old resource version: {since} ({self._compacted_rv})"
            yield {"type": "ERROR", "object": status_body(410, "Expired", message)}
            return
        else:
            position = bisect.bisect_right(log, since, key=lambda event: event.rv)
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while not self._closed:
            while position < len(log):
                event = _as_seen_by(log[position], visible)
                position += 1
                if event is not None:
                    yield event
            wakeup = self._wakeup
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                return
            try:
                await asyncio.wait_for(wakeup.wait(), remaining)
            except TimeoutError:
                return

    def close(self) -> None:
        """End every watch stream, so that the HTTP server can shut down without waiting for them."""
        self._closed = True
        self._wakeup.set()

    # -- internals ---------------------------------------------------------------------------------

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _index(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        position = (rt.key, meta.get("namespace") or "", meta["name"])
        self._live[rt.key][position[1:]] = obj
        self._uids[meta["uid"]] = obj
        if meta.get("deletionTimestamp"):
            self._terminating.add(position)
        owners = [self._uids.get(ref.get("uid", "")) for ref in meta.get("ownerReferences") or ()]
        if any(owner is None or owner["metadata"].get("deletionTimestamp") for owner in owners):
            self._gc_due = True

    def _unindex(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        position = (rt.key, meta.get("namespace") or "", meta["name"])
        self._live[rt.key].pop(position[1:], None)
        self._uids.pop(meta["uid"], None)
        self._terminating.discard(position)
        self._gc_due = True  # its dependents may be orphans now

    def _log(self, rt: ResourceType, kind: str, obj: Obj, old: Obj | None) -> None:
        self._events[rt.key].append(Event(kind, obj, old, int(obj["metadata"]["resourceVersion"])))
        self._wakeup.set()
        self._wakeup = asyncio.Event()


def _as_seen_by(event: Event, visible: Callable[[Obj], bool]) -> dict[str, Any] | None:
    """A selector watch sees an object leaving its selection as DELETED and entering it as ADDED."""
    now_visible = visible(event.object)
    was_visible = event.old is not None and visible(event.old)
    if event.type == "MODIFIED" and now_visible != was_visible:
        return {"type": "ADDED" if now_visible else "DELETED", "object": event.object}
    if now_visible or (event.type == "DELETED" and was_visible):
        return {"type": event.type, "object": event.object}
    return None


def _generation_content(obj: Obj, rt: ResourceType) -> Obj:
    """What `metadata.generation` tracks: everything but metadata (and status, with a status subresource)."""
    return {k: v for k, v in obj.items() if k != "metadata" and not (k == "status" and rt.has_status)}


def _blocking_finalizers(rt: ResourceType, obj: Obj) -> list[str]:
    finalizers = list(obj["metadata"].get("finalizers") or [])
    if rt.key == NAMESPACES:
        finalizers += (obj.get("spec") or {}).get("finalizers") or []
    return finalizers


def _deleting_finalizers(obj: Obj) -> list[str]:
    meta = obj["metadata"]
    return list(meta.get("finalizers") or []) if meta.get("deletionTimestamp") else []
