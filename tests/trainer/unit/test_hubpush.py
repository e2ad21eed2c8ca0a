"""checkpoint.pushToHub against a stand-in for the Hugging Face Hub (tests/support/fake_hub.py).

There is no network to huggingface.co here, so the Hub is a stand-in speaking its protocol: a
server on 127.0.0.1 implements the Hub endpoints huggingface_hub's create_repo / create_branch /
upload_folder call, the Git LFS batch and upload path of large files included, and records what it
receives. The tests check the token header, the repository and its visibility, that the committed
files are the export byte for byte (a file above the LFS threshold through the LFS upload URL),
that a 5xx answer is retried, and that a second call (a retry of the finished job) commits
nothing. hf_xet is installed here as in the trainer image, and the push turns Xet off itself, so
the LFS path tested is the one a real push takes. Whether the real Hub accepts the same requests
is not tested.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from llmtrain.api.hub import HUB_ENDPOINT_ENV, HUB_TOKEN_ENV
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.hubpush import HUB_PUSHED_FILE, HubPushError, push_to_hub

from tests.support.fake_hub import FakeHub, fake_hub
from tests.support.trainer import tiny_config

TOKEN = "hf_stand_in_write_token"
EXPORT = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": bytes(range(256)) * 4,
    "tokenizer/tokenizer.json": b'{"version": "1.0"}',
}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The stand-in Hub, named by HF_ENDPOINT. huggingface_hub read HF_ENDPOINT when first imported
    and sends a few requests of its own there (its agent-harness registry, fetched when it builds
    a user agent): the registry is set empty and the import-time endpoint is the stand-in's too,
    so that nothing leaves 127.0.0.1 whatever imported huggingface_hub first."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _detect_agent

    with fake_hub() as server:
        monkeypatch.setattr(_detect_agent, "_registry", {"standardEnvVars": [], "harnesses": {}})
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        monkeypatch.setenv(HUB_ENDPOINT_ENV, server.endpoint)
        monkeypatch.setenv(HUB_TOKEN_ENV, TOKEN)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def _exported(tmp_path: Path, **push: object) -> TrainerConfig:
    """A finished run's export folder, and its config pushing it to my-org/tiny-sft."""
    target = {"repoId": "my-org/tiny-sft", "tokenSecretRef": {"name": "hub", "key": "token"}, **push}
    config = tiny_config(tmp_path / "runs", "push", checkpoint={"export": True, "pushToHub": target})
    for name, data in EXPORT.items():
        path = Path(config.export_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return config


def test_the_export_lands_in_one_commit_after_a_refused_attempt(hub: FakeHub, tmp_path: Path) -> None:
    """The first create_repo is answered 503; the retry commits the whole export with the token from
    LLMTRAIN_HUB_TOKEN. A second call returns the recorded commit and sends nothing."""
    config = _exported(tmp_path)
    hub.fail("/api/repos/create", 503)
    pauses: list[float] = []

    url = push_to_hub(config, sleep=pauses.append)

    assert pauses == [2.0]
    repo = hub.repos["my-org/tiny-sft"]
    assert repo.private
    assert repo.branches["main"] == EXPORT
    ((branch, sha, summary),) = repo.commits
    assert (branch, summary) == ("main", "llmtrain: export of run push")
    assert url == f"{hub.endpoint}/my-org/tiny-sft/commit/{sha}"
    paths = [r.path for r in hub.requests]
    assert paths == [
        "/api/repos/create",
        "/api/repos/create",
        "/api/models/my-org/tiny-sft/preupload/main",
        "/api/models/my-org/tiny-sft/commit/main",
    ]
    assert {r.authorization for r in hub.requests} == {f"Bearer {TOKEN}"}
    assert paths.count("/api/models/my-org/tiny-sft/commit/main") == 1
    assert paths.count("/api/repos/create") == 2  # the refused one, the retry
    marker = json.loads((Path(config.run_dir) / HUB_PUSHED_FILE).read_text())
    assert (marker["repo_id"], marker["revision"], marker["commit_url"]) == ("my-org/tiny-sft", "main", url)

    sent = len(hub.requests)
    assert push_to_hub(config, sleep=pauses.append) == url
    assert len(hub.requests) == sent
    assert len(repo.commits) == 1


def test_a_file_above_the_lfs_threshold_goes_through_the_lfs_upload_url(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """model.safetensors (1 KiB) is at the stand-in's lowered LFS threshold: huggingface_hub asks the
    LFS batch API for an upload URL, PUTs the bytes there, verifies them, and the commit names the
    object by its sha256 instead of carrying it. hf_xet is importable and Xet is on in this process,
    as in the trainer image: the push itself takes the LFS path, and leaves Xet on afterwards."""
    import importlib.util

    from huggingface_hub import constants
    from huggingface_hub.utils._runtime import is_xet_available

    assert importlib.util.find_spec("hf_xet") is not None, "hf_xet is a dependency of the trainer"
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    assert is_xet_available()
    hub.lfs_threshold = len(EXPORT["model.safetensors"])
    config = _exported(tmp_path)

    push_to_hub(config, sleep=lambda _: pytest.fail("the push was retried"))

    assert hub.repos["my-org/tiny-sft"].branches["main"] == EXPORT
    oid = hashlib.sha256(EXPORT["model.safetensors"]).hexdigest()
    assert hub.lfs_objects == {oid: EXPORT["model.safetensors"]}
    assert [(r.method, r.path) for r in hub.requests] == [
        ("POST", "/api/repos/create"),
        ("POST", "/api/models/my-org/tiny-sft/preupload/main"),
        ("POST", "/my-org/tiny-sft.git/info/lfs/objects/batch"),
        ("PUT", f"/lfs/upload/{oid}"),
        ("POST", f"/lfs/verify/{oid}"),
        ("POST", "/api/models/my-org/tiny-sft/commit/main"),
    ]
    commit = [json.loads(line) for line in hub.requests[-1].body.splitlines()]
    entries = {entry["value"]["path"]: entry for entry in commit if entry["key"] != "header"}
    assert entries["model.safetensors"] == {
        "key": "lfsFile",
        "value": {"path": "model.safetensors", "algo": "sha256", "oid": oid, "size": 1024},
    }
    assert entries["config.json"]["key"] == "file"  # below the threshold: inline
    assert is_xet_available()  # the rest of the process is left as it was


def test_a_branch_is_created_and_committed_to_and_a_new_target_pushes_again(
    hub: FakeHub, tmp_path: Path
) -> None:
    """checkpoint.pushToHub.revision: the branch is created from main and receives the commit;
    main stays empty. The marker is for one repository and branch: another one pushes again."""
    first = _exported(tmp_path, revision="run-1", private=False)
    url = push_to_hub(first, sleep=lambda _: None)
    assert url is not None
    repo = hub.repos["my-org/tiny-sft"]
    assert not repo.private
    assert repo.branches == {"main": {}, "run-1": EXPORT}
    assert [c[0] for c in repo.commits] == ["run-1"]

    moved = first.model_copy(
        update={
            "checkpoint": first.checkpoint.model_copy(
                update={"push_to_hub": first.checkpoint.push_to_hub.model_copy(update={"revision": None})}  # type: ignore[union-attr]
            )
        }
    )
    assert push_to_hub(moved, sleep=lambda _: None) != url
    assert repo.branches["main"] == EXPORT
    assert [c[0] for c in repo.commits] == ["run-1", "main"]


def test_the_push_gives_up_after_its_attempts_naming_the_repository(hub: FakeHub, tmp_path: Path) -> None:
    config = _exported(tmp_path)
    for _ in range(3):
        hub.fail("/api/repos/create", 500)
    pauses: list[float] = []
    with pytest.raises(HubPushError, match=r"Hub repository my-org/tiny-sft failed 3 times: .*500"):
        push_to_hub(config, attempts=3, sleep=pauses.append)
    assert pauses == [2.0, 4.0]
    assert not (Path(config.run_dir) / HUB_PUSHED_FILE).exists()
    assert hub.repos == {}


def test_a_hub_that_refuses_connections_is_a_push_error(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listening at HF_ENDPOINT: the transport's error is caught, retried and reported
    like an HTTP error answer, not raised past the driver."""
    from tests.support.cluster.processes import free_port

    monkeypatch.setenv(HUB_ENDPOINT_ENV, f"http://127.0.0.1:{free_port()}")
    pauses: list[float] = []
    with pytest.raises(HubPushError, match=r"Hub repository my-org/tiny-sft failed 2 times"):
        push_to_hub(_exported(tmp_path), attempts=2, sleep=pauses.append)
    assert pauses == [2.0]


def test_no_export_is_an_error_and_no_push_target_is_nothing(hub: FakeHub, tmp_path: Path) -> None:
    config = tiny_config(
        tmp_path / "runs",
        "none",
        checkpoint={
            "export": True,
            "pushToHub": {"repoId": "o/r", "tokenSecretRef": {"name": "hub", "key": "t"}},
        },
    )
    with pytest.raises(HubPushError, match=r"checkpoint.pushToHub o/r: there is no export in"):
        push_to_hub(config)
    assert push_to_hub(tiny_config(tmp_path / "runs", "plain")) is None
    assert hub.requests == []


def test_the_driver_pushes_to_the_hub_when_the_object_store_copy_failed_and_fails_the_job(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main.publish_export: the s3 copy fails (its own tests use a real S3 server; here it is made
    to raise), the Hub push still happens and its commit is reported; the driver exits 1 with the
    copy's reason as the root cause, so the job does not end as a silent success."""
    from llmtrain_trainer import main
    from llmtrain_trainer.objstore import ObjectStoreError

    config = _exported(tmp_path)

    def refused(_: TrainerConfig) -> str:
        raise ObjectStoreError("pushing the export to s3://models/tiny failed 4 times: refused")

    reported: list[tuple[str | None, str | None]] = []
    failures: list[str] = []
    from llmtrain_trainer import objstore

    monkeypatch.setattr(objstore, "push_export", refused)
    monkeypatch.setattr(main, "report_export", lambda _c, uri, commit: reported.append((uri, commit)))
    monkeypatch.setattr(main, "report_failure", lambda _c, cause: failures.append(cause))

    assert main.publish_export(config, None) == 1
    ((_, sha, _),) = hub.repos["my-org/tiny-sft"].commits
    assert reported == [(None, f"{hub.endpoint}/my-org/tiny-sft/commit/{sha}")]
    assert failures == ["pushing the export to s3://models/tiny failed 4 times: refused"]


def test_llmtrain_run_says_where_the_export_went_and_fails_when_the_hub_refuses(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`llmtrain run`'s end (local._push): the commit's URL on the console and exit 0; when every
    attempt is refused, the reason (naming the repository) and exit 1."""
    import io

    from llmtrain_trainer import hubpush, local
    from rich.console import Console

    config = _exported(tmp_path)
    console = Console(file=(shown := io.StringIO()), width=400)
    assert local._push(console, config) == 0
    ((_, sha, _),) = hub.repos["my-org/tiny-sft"].commits
    assert f"Export pushed to the Hub: {hub.endpoint}/my-org/tiny-sft/commit/{sha}" in shown.getvalue()

    other = _exported(tmp_path / "other", repoId="my-org/refused")
    monkeypatch.setattr(hubpush, "PUSH_ATTEMPTS", 1)  # no pauses
    hub.fail("/api/repos/create", 500)
    console = Console(file=(shown := io.StringIO()), width=400)
    assert local._push(console, other) == 1
    assert "pushing the export to the Hub repository my-org/refused failed" in shown.getvalue()
