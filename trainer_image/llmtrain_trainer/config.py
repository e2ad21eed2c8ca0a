"""Read the TrainerConfig the operator rendered (or `llmtrain run` built).

The model itself lives in `llmtrain.api.trainer_config`, shared with the renderer, so both sides
parse the same fields; this module only loads a file and turns problems into one-line errors.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmtrain.api.trainer_config import CONFIG_FILENAME, TrainerConfig
from pydantic import ValidationError

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_CONFIG_PATH",
    "ConfigError",
    "TrainerConfig",
    "load_config",
    "parse_config",
]

DEFAULT_CONFIG_PATH = Path("/etc/llmtrain") / CONFIG_FILENAME


class ConfigError(ValueError):
    """The trainer config is missing or invalid; the message names the file and the fields."""


def parse_config(text: str, source: str = "<config>") -> TrainerConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc}") from exc
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{source} is not a valid TrainerConfig: {problems}") from exc


def load_config(path: Path) -> TrainerConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read trainer config {path}: {exc.strerror or exc}") from exc
    return parse_config(text, str(path))
