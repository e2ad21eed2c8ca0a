"""The pure parts of `llmtrain upload`: the pod it runs, the tar it streams, the check of what arrived.
The copy itself runs against a real node in the pods tier."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path, PurePosixPath

import pytest
from llmtrain.upload import (
    Target,
    UploadError,
    check_listing,
    local_files,
    tar_stream,
    target_for,
    upload_pod,
)

from tests.chart.security import restricted_violations


def test_upload_pod_meets_restricted_pod_security_and_mounts_the_claim() -> None:
    pod = upload_pod(Target("team-a", "data", PurePosixPath("data")), "trainer:dev", "llmtrain-upload-x")
    assert restricted_violations(pod["spec"]) == []
    assert pod["spec"]["volumes"] == [{"name": "storage", "persistentVolumeClaim": {"claimName": "data"}}]
    assert pod["spec"]["securityContext"]["runAsUser"] == 1000
    assert pod["spec"]["activeDeadlineSeconds"] > 0  # never left holding the claim


def test_tar_is_owner_neutral_and_group_readable(tmp_path: Path) -> None:
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "a.txt").write_text("hello")
    secret_mode = tmp_path / "src" / "sub" / "b.bin"
    secret_mode.write_bytes(b"\0" * 10)
    secret_mode.chmod(0o600)
    script = tmp_path / "src" / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o700)
    with tarfile.open(fileobj=io.BytesIO(tar_stream(tmp_path / "src"))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"a.txt", "sub/b.bin", "run.sh"}
    assert members["sub/b.bin"].mode == 0o644 and members["run.sh"].mode == 0o755
    assert all(m.uid == 0 and m.uname == "" for m in members.values())
    assert local_files(tmp_path / "src") == {"a.txt": 5, "run.sh": 10, "sub/b.bin": 10}


def test_a_single_file_uploads_under_its_name(tmp_path: Path) -> None:
    (tmp_path / "one.jsonl").write_text("{}\n")
    with tarfile.open(fileobj=io.BytesIO(tar_stream(tmp_path / "one.jsonl"))) as tar:
        assert tar.getnames() == ["one.jsonl"]


def test_listing_must_hold_every_file_with_its_size() -> None:
    check_listing({"a.txt": 5, "sub/b c.bin": 10}, "a.txt 5\nsub/b c.bin 10\nother 1\n")
    with pytest.raises(UploadError, match=r"sub/b c.bin \(missing bytes, expected 10\)"):
        check_listing({"a.txt": 5, "sub/b c.bin": 10}, "a.txt 5\n")
    with pytest.raises(UploadError, match=r"a.txt \(3 bytes, expected 5\)"):
        check_listing({"a.txt": 5}, "a.txt 3\n")


def test_missing_source_and_escaping_targets_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UploadError, match="no such file or folder"):
        local_files(tmp_path / "nope")
    for bad in ("/etc", "../other-job"):
        with pytest.raises(UploadError, match="relative to the claim"):
            target_for("default", "data", None, bad, core=None)
