"""Kopf's watch events without `metadata.managedFields`.

Kopf keeps each object's latest watch event decoded until a worker has handled it, and a burst
keeps a thousand jobs and their RayJobs in flight at once. The API server sends every object
with its managedFields (one entry per field manager: the creator's listing every field it set,
the operator's status writes, Kopf's, KubeRay's), 41 % of a job's JSON and 44 % of a RayJob's in
`make bench-operator`. Neither Kopf (its diff base is the spec, labels and annotations) nor any
handler here reads them (`reporting`'s digest leaves them out; the operator's writes are merge
patches and creates, not server-side apply), so they are dropped as each event leaves Kopf's
watch stream (`kopf._cogs.clients.watching.continuous_watch`, the LIST's items and the WATCH's
events alike), before Kopf queues it. This reaches into one Kopf module (pinned by constraints.txt);
`tests/unit/test_operator_slim.py` fails if Kopf stops calling it that way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kopf._cogs.clients import watching

_MARK = "_llmtrain_slim"


def strip(item: Any) -> Any:
    """The watch stream's item with its object's managedFields dropped (a Bookmark as it is)."""
    if isinstance(item, dict):
        obj = item.get("object")
        if isinstance(obj, dict):
            metadata = obj.get("metadata")
            if isinstance(metadata, dict):
                metadata.pop("managedFields", None)
    return item


def install() -> None:
    """Wrap Kopf's `continuous_watch` (once): `infinite_watch` looks it up by name at each call."""
    original = watching.continuous_watch
    if getattr(original, _MARK, False):
        return

    async def continuous_watch(**kwargs: Any) -> AsyncIterator[Any]:
        async for item in original(**kwargs):
            yield strip(item)

    setattr(continuous_watch, _MARK, True)
    setattr(watching, "continuous_watch", continuous_watch)  # noqa: B010
