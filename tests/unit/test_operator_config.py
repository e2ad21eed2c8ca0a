"""`llmtrain operator`'s command line becomes one OperatorConfig; a line that cannot run says which
flag to fix before anything connects."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmtrain.cli import build_parser
from llmtrain.operator import main
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.election import Election


def _config(*argv: str) -> OperatorConfig:
    return main.config_from(build_parser().parse_args(["operator", *argv]))


def test_without_leader_election_there_is_no_election() -> None:
    assert _config().election is None


def test_leader_election_takes_client_gos_proportions_of_the_lease() -> None:
    config = _config("--leader-elect", "--leader-election-namespace=ops", "--lease-seconds=15")
    assert config.election == Election(
        lease_name="llmtrain-operator",
        lease_namespace="ops",
        lease_seconds=15,
        renew_deadline_seconds=10,
        retry_seconds=2,
    )


def test_in_a_pod_the_lease_lives_in_the_pods_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace_file = tmp_path / "namespace"
    namespace_file.write_text("llmtrain-system\n")
    monkeypatch.setattr(main, "POD_NAMESPACE_FILE", namespace_file)
    election = _config("--leader-elect").election
    assert election is not None and election.lease_namespace == "llmtrain-system"


def test_outside_a_pod_leader_election_needs_a_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(main, "POD_NAMESPACE_FILE", tmp_path / "absent")
    with pytest.raises(main.ConfigError, match="--leader-election-namespace"):
        _config("--leader-elect")
    with pytest.raises(main.ConfigError, match="--lease-seconds"):
        _config("--leader-elect", "--leader-election-namespace=ops", "--lease-seconds=2")


def test_every_holder_identity_is_unique_to_its_process() -> None:
    election = Election(lease_name="l", lease_namespace="n")
    assert election.holder() != election.holder()
    assert Election(lease_name="l", lease_namespace="n", identity="pod-a").holder() == "pod-a"
