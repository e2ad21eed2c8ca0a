"""The Ray the RayJob declares (its rayVersion, passed to every Ray pod) against the Ray the image has.

KubeRay gates features on `rayVersion` (token authentication needs 2.52) and never looks inside the
image, so a custom `spec.resources.image` whose Ray differs from what the job declares would run with
KubeRay's assumptions wrong: an older Ray ignores RAY_AUTH_MODE and leaves the dashboard and job API
open. The driver checks before it starts Ray; a patch release apart is only worth a warning.
"""

from __future__ import annotations

import re

from llmtrain.constants import MIN_RAY_VERSION, RAY_VERSION_ENV

_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")
FIX = (
    "set spec.resources.rayVersion to the Ray of spec.resources.image, or for the operator's default "
    "image the chart value trainerImage.rayVersion (--trainer-ray-version)"
)


class RayVersionMismatch(Exception):
    """The image's Ray is not what the RayJob declares, beyond a patch release, or is too old for
    Ray token authentication."""


def _release(version: str) -> tuple[int, int, int] | None:
    match = _RELEASE.match(version)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def check_ray_version(declared: str | None, installed: str) -> str | None:
    """None when they agree (or nothing is declared: a local run); a warning for a patch release
    apart; RayVersionMismatch, naming both and the field to fix, otherwise."""
    if not declared:
        return None
    have, want = _release(installed), _release(declared)
    minimum = ".".join(map(str, MIN_RAY_VERSION))
    if have is not None and have < MIN_RAY_VERSION:
        raise RayVersionMismatch(
            f"the image has Ray {installed}, older than {minimum}: it ignores the token authentication "
            f"the job's Ray cluster runs with (the RayJob declares rayVersion {declared}); use an image "
            f"with Ray {minimum} or later"
        )
    if have is None or want is None or have[:2] != want[:2]:
        raise RayVersionMismatch(
            f"the image has Ray {installed} but the RayJob declares rayVersion {declared} "
            f"({RAY_VERSION_ENV}); KubeRay configures the cluster for the declared one: {FIX}"
        )
    if have != want:
        return f"the image has Ray {installed}, the RayJob declares {declared} (a patch release apart): {FIX}"
    return None
