"""The ConfigMap carrying the TrainerConfig the trainer's main reads.

Immutable: the config a running job trains with never changes under it, not even when a newer
operator would render it differently (an upgrade, a restart); the operator creates it and never
writes it again. A new config takes a new job.
"""

from __future__ import annotations

from typing import Any

from llmtrain.api.job import LLMTrainingJob
from llmtrain.api.trainer_config import TrainerConfig
from llmtrain.constants import CONFIG_FILENAME
from llmtrain.render.labels import object_meta
from llmtrain.render.names import configmap_name


def render_configmap(job: LLMTrainingJob, config: TrainerConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(job, configmap_name(job.metadata.name), "trainer-config"),
        "data": {CONFIG_FILENAME: config.model_dump_json(by_alias=True, exclude_none=True, indent=2)},
        "immutable": True,
    }
