"""Pure rendering: an LLMTrainingJob in, its child objects out. No I/O, no clock, no randomness."""

from __future__ import annotations

from typing import Any

from llmtrain.api.job import LLMTrainingJob
from llmtrain.render.configmap import render_configmap
from llmtrain.render.rayjob import ImageSettings, render_rayjob
from llmtrain.render.rbac import render_rbac
from llmtrain.render.storage import render_pvc
from llmtrain.render.trainer_config import cluster_trainer_config

__all__ = ["ImageSettings", "render"]


def render(job: LLMTrainingJob, images: ImageSettings | None = None) -> list[dict[str, Any]]:
    """Children in creation order: identity and config before the RayJob that uses them."""
    images = images or ImageSettings()
    objects: list[dict[str, Any]] = [*render_rbac(job)]
    pvc = render_pvc(job)
    if pvc is not None:
        objects.append(pvc)
    objects.append(render_configmap(job, cluster_trainer_config(job)))
    objects.append(render_rayjob(job, images))
    return objects
