"""Pretrained weights on local disk: the model's own folder, or its hub snapshot in the HF cache.

Fetching is kept apart from loading. Rank 0 downloads first while the others wait (a download
involves no collective), then every rank loads from the local folder at the same time: under ZeRO-3
`from_pretrained` is itself collective, so a rank-0-only load would deadlock. A failed download is
an error naming the model and the cause; a silent fallback hides a 401 or a 429 and then loads a
full fp32 copy on one rank instead.
"""

from __future__ import annotations

import logging
from pathlib import Path

from llmtrain.api.spec import ModelSpec
from llmtrain.api.trainer_config import TrainerConfig

from llmtrain_trainer.distributed import WorkerEnv, rank_zero_first
from llmtrain_trainer.model import ModelError, first_line, hf_token

log = logging.getLogger(__name__)

# The config, the weights with their index, and any remote code; never the tokenizer or `original/`.
MODEL_FILES = ["*.json", "*.safetensors", "*.py"]
# Only for repositories without safetensors, so the usual ones are not downloaded twice.
LEGACY_WEIGHT_FILES = ["*.bin"]


def has_safetensors(folder: Path) -> bool:
    return any(folder.glob("*.safetensors"))


def with_model_folder(config: TrainerConfig) -> TrainerConfig:
    """`config` with a relative model.name made absolute where it names a folder under paths_base.

    'org/model' reads as a hub id but may be a folder on the shared storage (an earlier export).
    The driver decides once, before any worker starts, and the workers get the decided name: each
    deciding by `Path(name).is_dir()` against its own working directory made the driver load the
    folder and the workers ask the hub for it.
    """
    name = config.model.name
    if not name or config.paths_base is None or Path(name).is_absolute():
        return config
    folder = Path(config.paths_base) / name
    if not folder.is_dir():
        return config
    log.info("model.name %r is the folder %s", name, folder)
    return config.model_copy(update={"model": config.model.model_copy(update={"name": str(folder)})})


def local_folder(spec: ModelSpec, cached_only: bool = False) -> Path:
    """The folder holding the model's files: model.name itself, or its downloaded hub snapshot.

    `cached_only` looks in the Hugging Face cache without asking the hub.
    """
    name = spec.name
    assert name is not None
    own = Path(name)
    if own.is_absolute():  # a folder, already resolved (with_model_folder); never a hub id
        if not own.is_dir():
            raise ModelError(f"model.name {name!r}: no such folder on this node")
        return own
    from huggingface_hub import snapshot_download

    def fetch(patterns: list[str]) -> Path:
        return Path(
            snapshot_download(
                name,
                revision=spec.revision,
                token=hf_token(),
                allow_patterns=patterns,
                local_files_only=cached_only,
            )
        )

    try:
        folder = fetch(MODEL_FILES)
        if not has_safetensors(folder):
            folder = fetch(LEGACY_WEIGHT_FILES)
    except Exception as exc:  # any hub failure: 401, 404, 429, offline, a network error
        raise ModelError(
            f"model.name {name!r} is not a local folder and its weights could not be "
            f"downloaded from the Hugging Face Hub: {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    return folder


def fetch_weights(spec: ModelSpec, env: WorkerEnv) -> Path:
    """The local folder on every rank: rank 0 downloads, the others then find it in the cache.

    A collective (a barrier); on a cache that is not shared with rank 0, a rank downloads itself.
    """
    with rank_zero_first(env):
        if env.is_main:
            return local_folder(spec)
        try:
            return local_folder(spec, cached_only=True)
        except ModelError:
            log.info("%s is not in this node's Hugging Face cache; downloading it", spec.name)
            return local_folder(spec)
