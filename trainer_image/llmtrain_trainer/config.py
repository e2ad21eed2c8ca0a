"""Read the TrainerConfig the operator rendered (or `llmtrain run` built).

The model itself lives in `llmtrain.api.trainer_config`, shared with the renderer, so both sides
parse the same fields; this module loads a file and turns problems into one-line errors.

Fields this trainer does not know are dropped with a warning rather than refused: a job keeps the
trainer image it was created with, and a newer operator may render fields for newer images. (The
models forbid unknown fields for the user's spec, where a typo must fail.)
"""

from __future__ import annotations

import json
import logging
import os
import time
import types
import typing
from pathlib import Path
from typing import Any

from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.constants import CONFIG_FILENAME, CONFIG_PATH
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

log = logging.getLogger(__name__)

__all__ = [
    "CONFIG_FILENAME",
    "DEFAULT_CONFIG_PATH",
    "ConfigError",
    "TrainerConfig",
    "load_config",
    "parse_config",
]

DEFAULT_CONFIG_PATH = Path(CONFIG_PATH)


class ConfigError(ValueError):
    """The trainer config is missing or invalid; the message names the file and the fields."""


def parse_config(text: str, source: str = "<config>") -> TrainerConfig:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source} is not valid JSON: {exc}") from exc
    dropped: list[str] = []
    data = known_fields(TrainerConfig, data, "", dropped)
    if dropped:
        log.warning(f"{source}: ignoring fields this trainer does not know: {', '.join(dropped)}")
    try:
        return TrainerConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"{source} is not a valid TrainerConfig: {problems}") from exc


def known_fields(model: type[BaseModel], data: Any, path: str, dropped: list[str]) -> Any:
    """`data` with only the keys `model` (and its nested models) declare; the others named in
    `dropped`. Values that are not mappings are left for validation to judge."""
    if not isinstance(data, dict):
        return data
    fields: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        fields[name] = info
        if info.alias:
            fields[info.alias] = info
    out = {}
    for key, value in data.items():
        known = fields.get(key)
        if known is None:
            dropped.append(f"{path}{key}")
            continue
        nested = _model_in(known.annotation)
        out[key] = value if nested is None else known_fields(nested, value, f"{path}{key}.", dropped)
    return out


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (directly or as `X | None`); None for anything else."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


def load_config(path: Path) -> TrainerConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read trainer config {path}: {exc.strerror or exc}") from exc
    return parse_config(text, str(path))


# The job's uid, from the pod spec the operator rendered for this incarnation of the job.
JOB_UID_ENV = "LLMTRAIN_JOB_UID"


def load_current_config(path: Path, timeout: float = 180.0, poll: float = 5.0) -> TrainerConfig:
    """The mounted config, once it is this job's. A job deleted and applied again under the same
    name gets a ConfigMap of the same name; a kubelet that still caches the earlier one (its pods
    were still on the node) mounts the earlier job's config, whose run is the earlier uid: training
    would silently continue the old run. The pod's own uid says which config is current; the kubelet
    refreshes the volume within its sync period, so wait for that, then give up naming both."""
    expected = os.environ.get(JOB_UID_ENV, "")
    config = load_config(path)
    deadline = time.monotonic() + timeout
    while expected and config.run_name != expected:
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"the trainer config mounted at {path} is for run {config.run_name}, an earlier job named "
                f"{config.job.name}; this job is {expected} and its config did not arrive in {timeout:.0f} s"
            )
        log.warning(
            "the mounted trainer config is an earlier job's (run %s, this job %s): waiting for the kubelet "
            "to refresh it",
            config.run_name,
            expected,
        )
        time.sleep(poll)
        config = load_config(path)
    return config
