"""`llmtrain operator`'s command line becomes one OperatorConfig; a line that cannot run says which
flag to fix before anything connects."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmtrain.api.spec import STARTUP_BACKSTOP_SECONDS
from llmtrain.cli import build_parser
from llmtrain.operator import config
from llmtrain.operator.config import Election, OperatorConfig


def _config(*argv: str) -> OperatorConfig:
    return config.from_args(build_parser().parse_args(["operator", *argv]))


def test_without_leader_election_there_is_no_election() -> None:
    assert _config().election is None


def test_leader_election_takes_client_gos_proportions_of_the_lease() -> None:
    built = _config("--leader-elect", "--leader-election-namespace=ops", "--lease-seconds=15")
    assert built.election == Election(
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
    monkeypatch.setattr(config, "POD_NAMESPACE_FILE", namespace_file)
    election = _config("--leader-elect").election
    assert election is not None and election.lease_namespace == "llmtrain-system"


def test_outside_a_pod_leader_election_needs_a_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "POD_NAMESPACE_FILE", tmp_path / "absent")
    with pytest.raises(config.ConfigError, match="--leader-election-namespace"):
        _config("--leader-elect")
    with pytest.raises(config.ConfigError, match="--lease-seconds"):
        _config("--leader-elect", "--leader-election-namespace=ops", "--lease-seconds=2")


def test_every_holder_identity_is_unique_to_its_process() -> None:
    election = Election(lease_name="l", lease_namespace="n")
    assert election.holder() != election.holder()
    assert Election(lease_name="l", lease_namespace="n", identity="pod-a").holder() == "pod-a"


def test_bare_flags_give_the_default_configuration() -> None:
    """Every default has one home: the flags' defaults are the dataclass's."""
    assert _config() == OperatorConfig()


def test_flags_reach_the_configuration() -> None:
    built = _config(
        "-n",
        "a",
        "-n",
        "b",
        "--workers=4",
        "--resync-seconds=30",
        "--metrics-port=0",
        "--log-level=debug",
        "--log-format=plain",
        "--trainer-image=r/t:1",
        "--trainer-ray-version=2.61.1",
        "--image-pull-secret=s",
    )
    assert (built.namespaces, built.workers, built.resync_seconds) == (("a", "b"), 4, 30.0)
    assert (built.metrics_port, built.liveness_port, built.log_level, built.log_format) == (
        0,
        8080,
        "debug",
        "plain",
    )
    assert (built.images.trainer_image, built.images.pull_secrets) == ("r/t:1", ("s",))
    assert built.images.ray_version == "2.61.1"


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        ("--workers=0", "--workers"),
        ("--resync-seconds=0", "--resync-seconds"),
        (f"--startup-look-seconds={STARTUP_BACKSTOP_SECONDS}", "--startup-look-seconds"),  # KubeRay first
        ("--trainer-ray-version=2.51.0", "--trainer-ray-version"),  # below Ray token auth
        ("--trainer-ray-version=latest", "--trainer-ray-version"),
    ],
)
def test_a_value_that_cannot_run_names_its_flag(flag: str, named: str) -> None:
    with pytest.raises(config.ConfigError, match=named):
        _config(flag)


def test_a_bad_command_line_exits_2_before_anything_connects(capsys: pytest.CaptureFixture[str]) -> None:
    from llmtrain.cli import main as cli_main

    assert cli_main(["operator", "--workers=0"]) == 2
    assert "--workers" in capsys.readouterr().err
