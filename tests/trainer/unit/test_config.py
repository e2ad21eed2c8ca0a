"""The trainer reads the config a newer operator may have rendered: unknown fields are dropped with
a warning, not fatal (a job keeps the trainer image it was created with); known fields stay strict."""

from __future__ import annotations

import json
import logging

import pytest
from llmtrain.api.validation import parse_job
from llmtrain.render.trainer_config import cluster_trainer_config
from llmtrain_trainer.config import ConfigError, parse_config

from tests.support.jobs import load_example


def _rendered() -> dict:
    config = cluster_trainer_config(parse_job(load_example("tiny-cpu.yaml")))
    data: dict = json.loads(config.model_dump_json(by_alias=True, exclude_none=True))
    return data


def test_fields_from_a_newer_operator_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    data = _rendered()
    data["futureKnob"] = 1
    data["training"]["newSchedule"] = {"kind": "wsd"}
    data["model"]["config"]["rope_scaling"] = {"type": "yarn"}  # the model's own config is free-form
    with caplog.at_level(logging.WARNING):
        config = parse_config(json.dumps(data), "trainer-config.json")
    assert config.training.learning_rate == 0.003
    assert config.model.config is not None and config.model.config["rope_scaling"] == {"type": "yarn"}
    assert "futureKnob" in caplog.text and "training.newSchedule" in caplog.text
    assert "rope_scaling" not in caplog.text


def test_known_fields_are_still_judged() -> None:
    data = _rendered()
    data["training"]["learningRate"] = "fast"
    with pytest.raises(ConfigError, match=r"learningRate|learning_rate"):
        parse_config(json.dumps(data))
