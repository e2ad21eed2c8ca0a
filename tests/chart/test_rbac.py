"""The operator's rendered RBAC grants exactly what the operator calls: no less, no more.

The truth is llmtrain.operator.permissions.OPERATOR_PERMISSIONS (every API call the operator makes,
checked against the operator's recorded calls by the operator's own tests).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import helm_python
import pytest
from llmtrain.generate import rules_yaml
from llmtrain.operator.permissions import ELECTION_PERMISSIONS, OPERATOR_PERMISSIONS
from llmtrain.render.rbac import reporter_rules

from tests.chart.helm import ALL_SETS, CHART, NAMESPACE, Obj, find, load_values, one, render, render_set

Triple = tuple[str, str, str]
EXPECTED: frozenset[Triple] = frozenset(
    (p.api_group, p.resource, verb) for p in OPERATOR_PERMISSIONS for verb in (*p.verbs, *p.admission_only)
)
SECRET_READ: Triple = ("", "secrets", "get")


def triples(role: Obj) -> set[Triple]:
    out: set[Triple] = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


def operator_roles(objects: tuple[Obj, ...] | list[Obj]) -> list[Obj]:
    return [
        o
        for o in objects
        if o["kind"] in {"Role", "ClusterRole"} and o["metadata"]["name"].endswith("-operator")
    ]


def test_rules_file_is_generated_from_the_permission_list() -> None:
    assert (CHART / "files" / "operator-rules.yaml").read_text() == rules_yaml(OPERATOR_PERMISSIONS)
    assert (CHART / "files" / "election-rules.yaml").read_text() == rules_yaml(ELECTION_PERMISSIONS)


def test_leader_election_rights_are_one_role_in_the_release_namespace() -> None:
    """The Lease is the operator's only write outside the jobs' namespaces, and it stays in its own."""
    objects = render({})
    role = one(objects, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert triples(role) == {
        ("coordination.k8s.io", "leases", verb) for p in ELECTION_PERMISSIONS for verb in p.verbs
    }
    binding = one(objects, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert (
        binding["subjects"][0]["name"]
        == one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    )
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args
    assert args[args.index("--leader-election-namespace") + 1] == NAMESPACE
    disabled = render({"leaderElection": {"enabled": False}})
    assert not find(disabled, "Role") and "--leader-elect" not in str(disabled)
    assert one(disabled, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    assert one(objects, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"


def test_more_than_one_replica_without_leader_election_is_refused() -> None:
    with pytest.raises(helm_python.HelmRenderError, match=r"leaderElection\.enabled is false"):
        render({"replicaCount": 2, "leaderElection": {"enabled": False}})


def test_expected_triples_are_not_empty() -> None:
    assert ("ray.io", "rayjobs", "create") in EXPECTED
    assert SECRET_READ not in EXPECTED


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_operator_gets_exactly_the_permissions_it_uses(value_set: str) -> None:
    values = {} if value_set == "default" else load_values(value_set)
    rbac = values.get("rbac", {})
    objects = render_set(value_set)
    roles = operator_roles(objects)
    if rbac.get("create") is False:
        assert roles == []
        return
    expected = set(EXPECTED) | ({SECRET_READ} if rbac.get("readSecrets") else set())
    namespaces = values.get("watchNamespaces", [])
    if namespaces:
        assert {r["kind"] for r in roles} == {"Role"}
        assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    else:
        assert [r["kind"] for r in roles] == ["ClusterRole"]
    for role in roles:
        granted = triples(role)
        assert not expected - granted, f"missing: {sorted(expected - granted)}"
        assert not granted - expected, f"more than the operator uses: {sorted(granted - expected)}"


@pytest.mark.parametrize("value_set", ALL_SETS)
def test_every_operator_role_is_bound_to_the_operator_service_account(value_set: str) -> None:
    objects = render_set(value_set)
    deployment = one(objects, "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    for role in operator_roles(objects):
        binding_kind = "RoleBinding" if role["kind"] == "Role" else "ClusterRoleBinding"
        bindings = [
            b
            for b in find(objects, binding_kind, role["metadata"]["name"])
            if b["metadata"].get("namespace") == role["metadata"].get("namespace")
        ]
        assert len(bindings) == 1
        binding = bindings[0]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role["kind"],
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]


def test_namespaced_install_has_nothing_cluster_wide_for_the_operator() -> None:
    objects = render_set("namespaced-rbac")
    assert not find(objects, "ClusterRoleBinding")
    assert [o["metadata"]["name"] for o in find(objects, "ClusterRole")] == ["llmtrain-edit", "llmtrain-view"]


def test_operator_may_create_the_reporter_role_it_renders() -> None:
    """RBAC escalation prevention: the operator can only create (and bind) Roles granting what it
    holds itself."""
    reporter = {
        (g, r, v)
        for rule in reporter_rules()
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert reporter
    assert reporter <= EXPECTED


def test_user_roles_aggregate_into_builtin_roles() -> None:
    objects = render_set("default")
    edit = one(objects, "ClusterRole", "llmtrain-edit")
    view = one(objects, "ClusterRole", "llmtrain-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in view["metadata"]["labels"]
    jobs = ("llmtrain.dev", "llmtrainingjobs")
    read = {"get", "list", "watch"}
    assert triples(view) == {(*jobs, v) for v in read} | {
        ("llmtrain.dev", "llmtrainingjobs/status", v) for v in read
    }
    edit_triples = triples(edit)
    assert {(*jobs, v) for v in ("create", "update", "patch", "delete", "deletecollection")} <= edit_triples
    # Status belongs to the operator and the trainer: people can read it, never write it.
    assert {t for t in edit_triples if t[1] == "llmtrainingjobs/status"} == {
        ("llmtrain.dev", "llmtrainingjobs/status", v) for v in read
    }
    assert {t[0] for t in edit_triples | triples(view)} == {"llmtrain.dev"}


def test_user_roles_can_be_left_out() -> None:
    objects = render({"rbac": {"userRoles": {"create": False}}})
    assert [o["metadata"]["name"] for o in find(objects, "ClusterRole")] == ["llmtrain-operator"]


def test_missing_rules_file_fails_loudly(tmp_path: Path) -> None:
    """An empty rules file must not render an operator without permissions."""
    copy = tmp_path / "llmtrain"
    shutil.copytree(CHART, copy)
    (copy / "files" / "operator-rules.yaml").write_text("# emptied\n")
    with (
        helm_python.Chart.load(copy) as chart,
        pytest.raises(helm_python.HelmRenderError, match="make generate"),
    ):
        chart.render({}, name="llmtrain", namespace=NAMESPACE)


def test_readme_permission_table_matches_the_code() -> None:
    readme = (CHART / "README.md").read_text()
    section = readme.split("\n## RBAC\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]*)` \| `([^`]+)` \| ([a-z, ]+) \|", section, flags=re.MULTILINE)
    documented = {
        (group.strip('"'), resource, verb.strip())
        for group, resource, verbs in rows
        for verb in verbs.split(",")
    }
    assert documented == EXPECTED, "the README's RBAC table is out of date"
