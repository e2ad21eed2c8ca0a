"""The operator's namespace reporter rights (`operator/reporter.py`) against an in-memory API: read
first, create what is missing, once per namespace until the verification period has passed, put
back what was edited, never take over someone else's object. The real API server and the chart's
policies: tests/cluster/test_reporter_policy.py."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
from llmtrain.constants import REPORTER_NAME
from llmtrain.operator.children import OwnershipConflict
from llmtrain.operator.kube import ApiError, Kube, Resource
from llmtrain.operator.reporter import ReporterRbac
from llmtrain.render.rbac import render_reporter_rbac


class MemoryApi:
    """get/create/merge_patch over a dict, recording each call."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.race: dict[str, dict[str, Any]] = {}  # kind: made by someone else just before our create

    def get(self, res: Resource, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append(("get", res.plural))
        try:
            return copy.deepcopy(self.objects[(res.plural, namespace, name)])
        except KeyError:
            raise ApiError(404, "NotFound", name) from None

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        plural = {"Role": "roles", "RoleBinding": "rolebindings"}[obj["kind"]]
        self.calls.append(("create", plural))
        key = (plural, obj["metadata"]["namespace"], obj["metadata"]["name"])
        if obj["kind"] in self.race:  # another replica made it between our read and our create
            self.objects[key] = copy.deepcopy(self.race.pop(obj["kind"]))
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", key[2])
        self.objects[key] = copy.deepcopy(obj)
        return obj

    def merge_patch(self, res: Resource, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("patch", res.plural))
        self.objects[(res.plural, namespace, name)].update(copy.deepcopy(patch))
        return self.objects[(res.plural, namespace, name)]


def kube(api: MemoryApi) -> Kube:
    return cast(Kube, api)


def test_made_once_per_namespace_read_first_then_trusted_for_a_while() -> None:
    api, reporter = MemoryApi(), ReporterRbac(verify_seconds=3600)
    assert reporter.ensure(kube(api), "team-a") == [
        f"created Role/{REPORTER_NAME}",
        f"created RoleBinding/{REPORTER_NAME}",
    ]
    assert api.calls == [
        ("get", "roles"),
        ("create", "roles"),
        ("get", "rolebindings"),
        ("create", "rolebindings"),
    ]
    role, binding = render_reporter_rbac("team-a")
    assert api.objects[("roles", "team-a", REPORTER_NAME)] == role
    assert api.objects[("rolebindings", "team-a", REPORTER_NAME)] == binding
    api.calls.clear()
    for _ in range(100):  # a burst of jobs in the namespace: no request at all
        assert reporter.ensure(kube(api), "team-a") == []
    assert api.calls == []
    reporter.ensure(kube(api), "team-b")  # another namespace: its own
    assert ("create", "roles") in api.calls


def test_deleted_or_edited_by_hand_it_is_made_again_once_read_again() -> None:
    api, reporter = MemoryApi(), ReporterRbac(verify_seconds=0)
    reporter.ensure(kube(api), "team-a")
    del api.objects[("roles", "team-a", REPORTER_NAME)]
    api.objects[("rolebindings", "team-a", REPORTER_NAME)]["subjects"] = []
    assert reporter.ensure(kube(api), "team-a") == [
        f"created Role/{REPORTER_NAME}",
        f"put back RoleBinding/{REPORTER_NAME}",
    ]
    assert reporter.ensure(kube(api), "team-a") == []  # in step: reads only
    # The resync pass forgets what it knew: the next ensure reads again, however recent.
    trusting = ReporterRbac(verify_seconds=3600)
    trusting.ensure(kube(api), "team-a")
    del api.objects[("roles", "team-a", REPORTER_NAME)]
    assert trusting.ensure(kube(api), "team-a") == []
    trusting.forget()
    assert trusting.ensure(kube(api), "team-a") == [f"created Role/{REPORTER_NAME}"]


def test_an_existing_one_is_never_created_again_and_a_race_is_fine() -> None:
    api, reporter = MemoryApi(), ReporterRbac()
    for obj in render_reporter_rbac("team-a"):
        api.create(obj)
    api.calls.clear()
    assert reporter.ensure(kube(api), "team-a") == []
    assert [verb for verb, _ in api.calls] == ["get", "get"]  # no create against a quota
    racing, other = MemoryApi(), ReporterRbac()
    racing.race = {"Role": render_reporter_rbac("team-a")[0]}
    assert other.ensure(kube(racing), "team-a") == [f"created RoleBinding/{REPORTER_NAME}"]  # 409, read again
    assert racing.calls[:3] == [("get", "roles"), ("create", "roles"), ("get", "roles")]


def test_someone_elses_object_of_that_name_is_never_taken_over() -> None:
    api, reporter = MemoryApi(), ReporterRbac()
    theirs = render_reporter_rbac("team-a")[0]
    theirs["metadata"]["labels"] = {}
    theirs["rules"] = []
    api.objects[("roles", "team-a", REPORTER_NAME)] = theirs
    with pytest.raises(OwnershipConflict, match="was not created by llmtrain"):
        reporter.ensure(kube(api), "team-a")
    assert api.objects[("roles", "team-a", REPORTER_NAME)]["rules"] == []
    # Nothing remembered: the next reconcile looks again.
    with pytest.raises(OwnershipConflict):
        reporter.ensure(kube(api), "team-a")
