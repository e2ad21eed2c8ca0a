"""Object-store URIs against a real S3 server (versitygw, tests/support/s3.py): the driver's cache
copies each object once for every rank, restart and second job, a changed object is copied again,
and the export push lands in the bucket once, retried when the store refuses it."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain_trainer.objstore import ObjectStoreError, cache_root, fetch, push_export, stage_inputs

from tests.support.s3 import S3Server, requests, versitygw
from tests.support.trainer import tiny_config


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with versitygw(tmp_path_factory.mktemp("s3")) as server:
        server.client().create_dir("corpus")
        yield server


@pytest.fixture(autouse=True)
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)


def put(s3: S3Server, key: str, data: bytes) -> None:
    with s3.client().open_output_stream(key) as out:
        out.write(data)


def _stage(args: tuple[str, str]) -> str:
    """One 'rank' or driver in its own process: stage the config, return the dataset's local path."""
    config_json, env_endpoint = args
    os.environ["AWS_ENDPOINT_URL"] = env_endpoint
    staged = stage_inputs(TrainerConfig.model_validate_json(config_json))
    assert staged.dataset.path is not None
    return staged.dataset.path


def test_two_processes_and_a_restart_download_the_object_once(s3: S3Server, tmp_path: Path) -> None:
    put(s3, "corpus/once/stories.txt", b"once upon a time\n" * 100)
    config = tiny_config(tmp_path / "runs" / "job", "once", dataset={"path": "s3://corpus/once/stories.txt"})
    # Two processes at once (two drivers racing, or ranks that would each fetch), then a restart.
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        paths = pool.map(_stage, [(config.model_dump_json(by_alias=True), s3.endpoint)] * 2)
    again = stage_inputs(config)
    assert again.dataset.path is not None
    assert set(paths) == {again.dataset.path}
    assert Path(again.dataset.path).read_bytes() == b"once upon a time\n" * 100
    # The racers may both have copied (each into its own folder, one rename wins); the restart never.
    gets = requests(s3, "GetObject", "once/stories.txt")
    assert 1 <= gets <= 2
    stage_inputs(config)
    assert requests(s3, "GetObject", "once/stories.txt") == gets
    assert [p.name for p in cache_root(config).iterdir()] == [Path(again.dataset.path).parent.name]


def test_a_changed_object_is_copied_again_and_a_prefix_copies_as_a_folder(
    s3: S3Server, tmp_path: Path
) -> None:
    put(s3, "corpus/prefix/a.jsonl", b'{"text": "a"}\n')
    put(s3, "corpus/prefix/sub/b.jsonl", b'{"text": "b"}\n')
    first = fetch("s3://corpus/prefix", tmp_path)
    assert sorted(str(p.relative_to(first)) for p in first.rglob("*.jsonl")) == ["a.jsonl", "sub/b.jsonl"]
    put(s3, "corpus/prefix/a.jsonl", b'{"text": "a, longer now"}\n')
    second = fetch("s3://corpus/prefix", tmp_path)
    assert second != first
    assert (second / "a.jsonl").read_bytes() == b'{"text": "a, longer now"}\n'


def test_a_missing_object_is_an_error_naming_the_uri(tmp_path: Path) -> None:
    with pytest.raises(ObjectStoreError, match=r"s3://corpus/nothing-here does not exist"):
        fetch("s3://corpus/nothing-here", tmp_path)


def _exported(tmp_path: Path, destination: str) -> TrainerConfig:
    config = tiny_config(tmp_path / "runs", "push", checkpoint={"export": True, "exportTo": destination})
    export = Path(config.export_dir)
    (export / "tokenizer").mkdir(parents=True)
    (export / "config.json").write_text("{}")
    (export / "tokenizer" / "tokenizer.json").write_text("{}")
    return config


def test_the_export_is_pushed_once_after_a_refused_attempt(s3: S3Server, tmp_path: Path) -> None:
    """The bucket does not exist at the first attempt (the store refuses); the pause before the
    second creates it. A second call (a retry of the finished job) does not push again."""
    config = _exported(tmp_path, "s3://models/tiny/v1")
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        s3.client().create_dir("models")

    assert push_export(config, sleep=pause) == "s3://models/tiny/v1"
    assert len(pauses) == 1
    assert s3.keys("models") == ["tiny/v1/config.json", "tiny/v1/tokenizer/tokenizer.json"]
    puts = requests(s3, "PutObject", "tiny/v1/config.json") + requests(
        s3, "CompleteMultipartUpload", "tiny/v1/config.json"
    )
    assert puts >= 1
    assert push_export(config, sleep=pause) == "s3://models/tiny/v1"
    again = requests(s3, "PutObject", "tiny/v1/config.json") + requests(
        s3, "CompleteMultipartUpload", "tiny/v1/config.json"
    )
    assert again == puts


def test_the_push_gives_up_after_its_attempts(tmp_path: Path) -> None:
    config = _exported(tmp_path, "s3://no-such-bucket/tiny")
    pauses: list[float] = []
    with pytest.raises(
        ObjectStoreError, match=r"pushing the export to s3://no-such-bucket/tiny failed 3 times"
    ):
        push_export(config, attempts=3, sleep=pauses.append)
    assert pauses == [2.0, 4.0]


def test_a_validation_file_uri_is_staged_like_the_training_data(s3: S3Server, tmp_path: Path) -> None:
    """dataset.validationPath on the object store: the driver copies it into the same cache."""
    put(s3, "corpus/val/train.txt", b"once upon a time\n" * 50)
    put(s3, "corpus/val/held-out.txt", b"the end\n" * 20)
    config = tiny_config(
        tmp_path / "runs" / "job",
        "val",
        dataset={"path": "s3://corpus/val/train.txt", "validationPath": "s3://corpus/val/held-out.txt"},
    )
    staged = stage_inputs(config)
    assert staged.dataset.validation_path is not None and staged.dataset.path is not None
    assert Path(staged.dataset.validation_path).read_bytes() == b"the end\n" * 20
    assert Path(staged.dataset.validation_path).is_relative_to(cache_root(config))
    assert Path(staged.dataset.path).read_bytes() == b"once upon a time\n" * 50


def test_model_tokenizer_and_resume_checkpoint_uris_are_staged_and_a_retry_skips_resume_from(
    s3: S3Server, tmp_path: Path
) -> None:
    """model.name, model.tokenizer and resumeFrom.checkpoint on the object store: each folder is
    copied into the driver's cache and the config names the copy. A retry (a checkpoint of its own
    exists) resumes from that, so resumeFrom is left as it is and not copied."""
    s3.client().create_dir("weights")
    s3.client().create_dir("ckpts")
    put(s3, "weights/tiny/config.json", b'{"model_type": "llama"}')
    put(s3, "weights/tiny/model.safetensors", b"\x00" * 64)
    put(s3, "weights/tok/tokenizer.json", b'{"version": "1.0"}')
    put(s3, "ckpts/run/checkpoint-step-00000010/state.pt", b"\x01" * 32)
    source = "s3://ckpts/run/checkpoint-step-00000010"
    config = tiny_config(
        tmp_path / "runs" / "job",
        "weights",
        model={"name": "s3://weights/tiny", "config": None, "tokenizer": "s3://weights/tok"},
        resumeFrom={"checkpoint": source, "runsRoot": str(tmp_path / "runs")},
    )

    staged = stage_inputs(config)
    assert staged.model.name is not None and staged.model.tokenizer is not None
    assert staged.resume_from is not None and staged.resume_from.checkpoint is not None
    model, tokenizer = Path(staged.model.name), Path(staged.model.tokenizer)
    checkpoint = Path(staged.resume_from.checkpoint)
    for local in (model, tokenizer, checkpoint):
        assert local.is_relative_to(cache_root(config)), local
    assert sorted(p.name for p in model.iterdir()) == ["config.json", "model.safetensors"]
    assert (model / "model.safetensors").read_bytes() == b"\x00" * 64
    assert (tokenizer / "tokenizer.json").read_bytes() == b'{"version": "1.0"}'
    assert (checkpoint / "state.pt").read_bytes() == b"\x01" * 32

    retry = stage_inputs(config, resuming=True)
    assert retry.resume_from is not None and retry.resume_from.checkpoint == source
    assert retry.model.name == staged.model.name
