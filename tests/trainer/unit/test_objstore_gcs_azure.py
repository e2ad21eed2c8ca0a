"""gs:// and az:// URIs against real servers (fake-gcs-server, tests/support/gcs.py; Azurite,
tests/support/azure.py), as test_objstore.py does for s3://: a dataset is copied to the driver's
cache once for every restart, the export lands in the bucket once, and the credentials and endpoint
reach pyarrow from the environment (what spec.objectStorage's secretKeyRef entries give the pods)
or from spec.objectStorage itself."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from llmtrain_trainer.objstore import ObjectStoreError, cache_root, fetch, push_export, stage_inputs

from tests.support.object_stores import Store, started
from tests.support.trainer import tiny_config

# A client that lost its credentials retries against the (closed, loopback) metadata server for
# minutes: each test here takes seconds, so a minute means it is broken.
pytestmark = pytest.mark.timeout(60)

STORIES = b"once upon a time\n" * 100


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with started("gs", tmp_path_factory.mktemp("gcs")) as store:
        yield store


@pytest.fixture(scope="module")
def azure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with started("az", tmp_path_factory.mktemp("azure")) as store:
        yield store


@pytest.fixture(params=["gs", "az"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    chosen: Store = request.getfixturevalue({"gs": "gcs", "az": "azure"}[request.param])
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    for name, value in chosen.env.items():
        monkeypatch.setenv(name, value)
    return chosen


def test_a_dataset_is_copied_once_for_the_driver_and_its_restart(store: Store, tmp_path: Path) -> None:
    store.put("corpus/once/stories.txt", STORIES)
    uri = f"{store.scheme}://corpus/once/stories.txt"
    config = tiny_config(tmp_path / "runs" / "job", "once", dataset={"path": uri})
    staged = stage_inputs(config)
    assert staged.dataset.path is not None
    assert Path(staged.dataset.path).read_bytes() == STORIES
    assert store.downloads("corpus", "once/stories.txt") == 1
    again = stage_inputs(config)  # the restarted driver finds the copy
    assert again.dataset.path == staged.dataset.path
    assert store.downloads("corpus", "once/stories.txt") == 1
    assert [p.name for p in cache_root(config).iterdir()] == [Path(staged.dataset.path).parent.name]


def test_a_prefix_copies_as_a_folder_through_the_specs_endpoint(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No endpoint in the environment: spec.objectStorage's (the TrainerConfig's copy) is used."""
    monkeypatch.delenv(store.endpoint_env)
    store.put("corpus/prefix/a.jsonl", b'{"text": "a"}\n')
    store.put("corpus/prefix/sub/b.jsonl", b'{"text": "b"}\n')
    local = fetch(f"{store.scheme}://corpus/prefix", tmp_path, store.settings)
    assert sorted(str(p.relative_to(local)) for p in local.rglob("*.jsonl")) == ["a.jsonl", "sub/b.jsonl"]
    assert (local / "sub" / "b.jsonl").read_bytes() == b'{"text": "b"}\n'


def test_a_missing_object_is_an_error_naming_the_uri(store: Store, tmp_path: Path) -> None:
    uri = f"{store.scheme}://corpus/nothing-here"
    with pytest.raises(ObjectStoreError, match=f"{uri} does not exist"):
        fetch(uri, tmp_path)


def test_the_export_is_pushed_once(store: Store, tmp_path: Path) -> None:
    destination = f"{store.scheme}://models/tiny/v1"
    config = tiny_config(tmp_path / "runs", "push", checkpoint={"export": True, "exportTo": destination})
    export = Path(config.export_dir)
    (export / "tokenizer").mkdir(parents=True)
    (export / "config.json").write_text('{"model_type": "llama"}')
    (export / "tokenizer" / "tokenizer.json").write_text("{}")
    assert push_export(config, sleep=pytest.fail) == destination
    assert store.keys("models") == ["tiny/v1/config.json", "tiny/v1/tokenizer/tokenizer.json"]
    assert store.read("models/tiny/v1/config.json") == b'{"model_type": "llama"}'
    assert store.uploads("models", "tiny/v1/config.json") == 1
    assert push_export(config, sleep=pytest.fail) == destination  # a retry of the finished job
    assert store.uploads("models", "tiny/v1/config.json") == 1


def test_azurite_refuses_a_wrong_account_key(
    azure: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key really is what authenticates: Azurite checks each request's shared-key signature."""
    for name, value in azure.env.items():
        monkeypatch.setenv(name, value)
    azure.put("corpus/guarded.txt", b"x")
    monkeypatch.setenv(
        "AZURE_STORAGE_ACCOUNT_KEY", "d3Jvbmcta2V5LW9mLXRoZS1yaWdodC1sZW5ndGgtZm9yLWEta2V5Cg=="
    )
    with pytest.raises(ObjectStoreError, match=r"az://corpus/guarded.txt: cannot copy it"):
        fetch("az://corpus/guarded.txt", tmp_path)


def test_an_az_uri_without_an_account_names_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    with pytest.raises(ObjectStoreError, match=r"spec.objectStorage.azure.accountName"):
        fetch("az://corpus/a.txt", tmp_path)


def test_a_gs_uri_without_a_key_names_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No key: an error at once, not minutes of retries against Google's metadata server."""
    monkeypatch.delenv("LLMTRAIN_GCS_CREDENTIALS", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    with pytest.raises(ObjectStoreError, match=r"spec.objectStorage.gcs.credentialsSecretRef"):
        fetch("gs://corpus/a.txt", tmp_path)


def test_the_gcs_key_reaches_pyarrow_as_a_private_file(
    gcs: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """google-cloud-cpp reads a service-account key only from GOOGLE_APPLICATION_CREDENTIALS' file:
    the trainer writes the Secret's value there, readable by its own user only."""
    for name, value in gcs.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    gcs.put("corpus/keyed.txt", b"k")
    assert fetch("gs://corpus/keyed.txt", tmp_path).read_bytes() == b"k"
    key_file = Path(os.environ["GOOGLE_APPLICATION_CREDENTIALS"])
    assert key_file.read_text() == gcs.env["LLMTRAIN_GCS_CREDENTIALS"]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
