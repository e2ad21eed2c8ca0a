"""The reporter policy (templates/reporter-policy.yaml), offline: which status patches it lets
through. A namespace's ServiceAccounts all hold the reporter Role; this policy is what keeps each
job's trainer account to its own job. Evaluated as the API server does (match conditions, then
variables, then the validation) in the project's CEL engine, as tests/chart/test_containment.py
does; tests/cluster/test_reporter_policy.py runs it on a real API server."""

from __future__ import annotations

from typing import Any

import pytest
from llmtrain.constants import MAX_NAME_LENGTH
from llmtrain.render.names import trainer_account_name

from tests.chart.helm import NAMESPACE, find, one, render_set
from tests.chart.test_containment import _run

Obj = dict[str, Any]
OPERATOR = f"system:serviceaccount:{NAMESPACE}:llmtrain-operator"
LONG = "a-job-whose-name-is-long-enough-to-hash-its-kid"  # 47 characters: its trainer name is hashed
OTHER_LONG = LONG[:-3] + "xyz"  # the same 33-character prefix, another job


def policy(value_set: str = "default") -> Obj:
    return one(render_set(value_set), "ValidatingAdmissionPolicy", "llmtrain-reporter")


def judge(user: str, job: str, namespace: str = "team-a", spec: Obj | None = None) -> str | None:
    """None when the patch of `job`'s status by `user` is let through (not matched, or valid), else
    the refusal's message (an evaluation error refuses too: failurePolicy is Fail)."""
    spec = spec or policy()["spec"]
    request = {
        "operation": "UPDATE",
        "resource": {"group": "llmtrain.dev", "version": "v1alpha1", "resource": "llmtrainingjobs"},
        "subResource": "status",
        "namespace": namespace,
        "name": job,
        "userInfo": {"username": user},
    }
    bindings: dict[str, Any] = {"request": request}
    if not all(_run(c["expression"], bindings) is True for c in spec["matchConditions"]):
        return None
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:
        variables[variable["name"]] = _run(variable["expression"], {**bindings, "variables": variables})
    bindings["variables"] = variables
    (validation,) = spec["validations"]
    try:
        if _run(validation["expression"], bindings) is True:
            return None
    except Exception:
        return validation["expression"]
    return str(_run(validation["messageExpression"], bindings))


def account(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


@pytest.mark.parametrize("job", ["train", LONG], ids=["short", "hashed"])
def test_a_trainer_account_reports_its_own_job(job: str) -> None:
    assert len(trainer_account_name(LONG)) <= MAX_NAME_LENGTH < len(LONG + "-trainer")
    assert judge(account("team-a", trainer_account_name(job)), job) is None


def test_a_trainer_account_is_refused_another_jobs_status() -> None:
    message = judge(account("team-a", trainer_account_name("train")), "other")
    assert message == (
        "llmtrain reporter: ServiceAccount train-trainer may report the status of its own "
        "LLMTrainingJob only (the job it is the trainer account of), not of team-a/other"
    )
    # Nor can any other account of the namespace report for a job: the default one, a look-alike.
    for name in ("default", "train", "train-trainer-x", "xtrain-trainer", "other-trainer"):
        assert judge(account("team-a", name), "train") is not None, name


def test_a_differently_truncated_name_is_refused() -> None:
    hashed = trainer_account_name(LONG)  # "<33 characters>-<5 hex>-trainer"
    prefix, digest = hashed[: -len("-trainer") - 6], hashed[-len("-trainer") - 5 : -len("-trainer")]
    wrong = {
        "the hashed form of a short name": trainer_account_name("train")[:-8] + "-abcde-trainer",
        "a digest that is not 5 hex digits": f"{prefix}-ABCDE-trainer",
        "a 4-digit digest": f"{prefix[:-1]}-{digest[:4]}-trainer",
        "a prefix not of the job's name": f"b{prefix[1:]}-{digest}-trainer",
        "past the length limit": f"{prefix}x-{digest}-trainer",
        "another suffix": f"{prefix}-{digest}-trainex",
    }
    for case, name in wrong.items():
        assert judge(account("team-a", name), LONG if "short" not in case else "train") is not None, case
    # The policy cannot compute the digest: a job sharing the first 33 characters of the name is
    # the one collision left (README "Per-job RBAC").
    assert judge(account("team-a", hashed), OTHER_LONG) is None


def test_the_operator_people_and_other_namespaces_are_not_matched() -> None:
    assert judge(OPERATOR, "train") is None
    assert judge(f"system:serviceaccount:{NAMESPACE}:llmtrain-operator", "train", namespace=NAMESPACE) is None
    assert judge("alice", "train") is None
    assert judge("system:admin", "train") is None
    # An account of another namespace holds no reporter Role here; RBAC refuses it, not this policy.
    assert judge(account("team-b", "other-trainer"), "train") is None
    # An account of the operator's own namespace other than the operator's is confined there.
    assert judge(account(NAMESPACE, "someone"), "train", namespace=NAMESPACE) is not None


def test_the_policy_fails_closed_and_denies() -> None:
    objects = render_set("default")
    assert policy()["spec"]["failurePolicy"] == "Fail"
    (binding,) = [
        b for b in find(objects, "ValidatingAdmissionPolicyBinding") if "reporter" in b["metadata"]["name"]
    ]
    assert binding["spec"] == {"policyName": "llmtrain-reporter", "validationActions": ["Deny"]}
    rules = policy()["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": ["llmtrain.dev"],
            "apiVersions": ["*"],
            "resources": ["llmtrainingjobs/status"],
            "operations": ["UPDATE"],
        }
    ]


def test_the_operator_exemption_follows_the_service_account_value() -> None:
    spec = policy("existing-serviceaccount")["spec"]
    assert (
        judge(f"system:serviceaccount:{NAMESPACE}:platform-llmtrain-operator", "t", NAMESPACE, spec) is None
    )
    assert judge(OPERATOR, "t", NAMESPACE, spec) is not None
