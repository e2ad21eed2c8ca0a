"""A CRD installed after the operator started gets served even when discovery lags its events.

Kopf re-reads API discovery for a group on every event of one of that group's CRDs, and serves a
resource once discovery lists it. The API server, though, publishes a CRD in discovery from its own
work queue a moment *after* it reports the CRD Established: the last CRD event can outrun
discovery, Kopf finds nothing, and no further event ever comes, so the resource stays unserved
until a restart. `serve_late_crds` makes Kopf's per-group re-scan look again, briefly and with a
growing pause, until the resources this operator serves appear.

This reaches into one Kopf module (`kopf._cogs.clients.scanning`, pinned by constraints.txt);
`test_discovery` fails if Kopf stops calling it that way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any

from kopf._cogs.clients import scanning

from llmtrain.constants import API_GROUP, PLURAL, RAY_API_GROUP, RAYJOB_PLURAL

SERVED: Mapping[str, frozenset[str]] = {
    API_GROUP: frozenset({PLURAL}),
    RAY_API_GROUP: frozenset({RAYJOB_PLURAL}),
}
# About 15 s in all: the API server's discovery queue catches up within a second or two.
PAUSES: Sequence[float] = (0.5, 1.0, 2.0, 4.0, 8.0)

_log = logging.getLogger(__name__)

Scan = Callable[..., Coroutine[Any, Any, Collection[Any]]]


def missing(groups: Collection[str] | None, resources: Collection[Any]) -> set[str]:
    """`plural.group` of each served resource of a single re-scanned group that discovery lacks.
    Kopf's start-up scan (several groups at once) is not retried: a CRD absent then is normal."""
    if groups is None or len(groups) != 1:
        return set()
    (group,) = groups
    found = {r.plural for r in resources if r.group == group}
    return {f"{plural}.{group}" for plural in SERVED.get(group, frozenset()) - found}


def scan_until_served(scan: Scan, pauses: Sequence[float] = PAUSES) -> Scan:
    async def scan_resources(**kwargs: Any) -> Collection[Any]:
        resources = await scan(**kwargs)
        for pause in pauses:
            absent = missing(kwargs.get("groups"), resources)
            if not absent:
                break
            _log.info("Discovery does not list %s yet; scanning again in %s s", sorted(absent), pause)
            await asyncio.sleep(pause)
            resources = await scan(**kwargs)
        return resources

    scan_resources.__wrapped__ = scan  # type: ignore[attr-defined]
    return scan_resources


def serve_late_crds() -> None:
    """Install the retrying re-scan once per process."""
    if not hasattr(scanning.scan_resources, "__wrapped__"):
        scanning.scan_resources = scan_until_served(scanning.scan_resources)  # type: ignore[assignment]
