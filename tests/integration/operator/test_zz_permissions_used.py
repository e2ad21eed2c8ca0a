"""Runs after the scenarios in this folder (pytest orders files by name): every permission the
operator declares was needed by at least one scenario, so the chart grants nothing unused."""

from __future__ import annotations

from llmtrain.operator.permissions import OPERATOR_PERMISSIONS

from tests.integration.operator.conftest import SEEN_CALLS

# Used in production but not reachable in the emulator: Kopf posts Events through core/v1 only;
# events.k8s.io is granted for clusters/Kopf versions that post through the newer API.
# The finalizers grant is checked by an admission plugin (OwnerReferencesPermissionEnforcement), not
# called; the cluster tier shows it is needed (tests/cluster: children are created at all).
NOT_EXERCISED = {
    ("events.k8s.io", "events", "create"),
    ("llmtrain.dev", "llmtrainingjobs/finalizers", "update"),
}


def test_every_declared_permission_was_used() -> None:
    declared = {(p.api_group, p.resource, v) for p in OPERATOR_PERMISSIONS for v in p.verbs}
    assert SEEN_CALLS, "run this file together with the operator scenarios (tests/integration/operator)"
    unused = declared - SEEN_CALLS - NOT_EXERCISED
    assert not unused, f"declared but never used by any scenario: {sorted(unused)}"
