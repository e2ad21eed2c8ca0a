"""Kopf's per-group discovery re-scan looks again until the operator's resources appear
(operator/discovery.py): the API server lists a CRD in discovery a moment after its last event."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Collection
from typing import Any

from kopf._cogs.clients import scanning
from kopf._cogs.structs.references import Resource
from kopf._core.reactor import observation
from llmtrain.constants import API_GROUP, PLURAL, RAY_API_GROUP
from llmtrain.operator import discovery


def resource(group: str, plural: str) -> Resource:
    return Resource(group=group, version="v1", plural=plural, kind=plural.title(), namespaced=True)


class Discovery:
    """Lists the job resource only from the `ready_after`-th scan on."""

    def __init__(self, ready_after: int) -> None:
        self.ready_after = ready_after
        self.scans = 0

    async def __call__(self, **kwargs: Any) -> Collection[Resource]:
        self.scans += 1
        return {resource(API_GROUP, PLURAL)} if self.scans >= self.ready_after else set()


def scan(discovery_: Discovery, groups: set[str] | None, pauses: tuple[float, ...] = (0, 0, 0)) -> set[str]:
    patched = discovery.scan_until_served(discovery_, pauses)
    found = asyncio.run(patched(groups=groups, settings=None, logger=None))
    return {r.plural for r in found}


def test_a_group_rescan_looks_again_until_the_job_resource_is_listed() -> None:
    lagging = Discovery(ready_after=3)
    assert scan(lagging, {API_GROUP}) == {PLURAL}
    assert lagging.scans == 3


def test_the_looking_is_bounded() -> None:
    never = Discovery(ready_after=100)
    assert scan(never, {API_GROUP}, pauses=(0, 0)) == set()
    assert never.scans == 3


def test_start_up_scans_and_other_groups_are_not_retried() -> None:
    for groups in (None, {API_GROUP, RAY_API_GROUP}, {"example.com"}):
        absent = Discovery(ready_after=100)
        scan(absent, groups)
        assert absent.scans == 1, groups


def test_kopf_rescans_a_crd_group_through_the_patched_module_attribute() -> None:
    """The patch replaces `scanning.scan_resources`; Kopf must still look it up there per event."""
    source = inspect.getsource(observation.process_discovered_resource_event)
    assert "scanning.scan_resources(groups={group}" in source
    assert observation.scanning is scanning
    original = scanning.scan_resources
    try:
        discovery.serve_late_crds()
        discovery.serve_late_crds()
        assert scanning.scan_resources.__wrapped__ is original  # type: ignore[attr-defined]
    finally:
        scanning.scan_resources = original  # type: ignore[assignment]
