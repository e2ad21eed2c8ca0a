"""Pretrained weights: a download that fails is an error naming the model and the cause, never a
silent fallback (which used to load a full fp32 copy on rank 0 instead)."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest
from llmtrain.api.spec import ModelSpec
from llmtrain_trainer import weights
from llmtrain_trainer.model import ModelError


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No hub: offline mode and an empty cache, so nothing can be downloaded or found."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.mark.parametrize("name", ["llmtrain-tests/no-such-model"])
def test_a_model_that_cannot_be_downloaded_fails_with_its_name_and_the_cause(
    offline: None, name: str
) -> None:
    """(An absolute name is a folder, never a hub id: test_model_folder.py.)"""
    with pytest.raises(ModelError) as raised:
        weights.local_folder(ModelSpec(name=name))
    message = str(raised.value)
    assert repr(name) in message and "could not be downloaded" in message
    cause = raised.value.__cause__
    assert cause is not None and type(cause).__name__ in message


def test_a_hub_error_is_named_in_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    def rate_limited(*args: object, **kwargs: object) -> str:
        raise OSError("429 Client Error: Too Many Requests for url: https://huggingface.co/api/models/x")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", rate_limited)
    with pytest.raises(ModelError, match=r"'org/model'.*OSError: 429 Client Error: Too Many Requests"):
        weights.local_folder(ModelSpec(name="org/model"))


def test_a_local_folder_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert weights.local_folder(ModelSpec(name=str(tmp_path))) == tmp_path
    assert weights.has_safetensors(tmp_path)
