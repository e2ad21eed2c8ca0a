"""The operator's configuration: built once in `main` from the command line, read by the handlers
(through Kopf's memo), never through the environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmtrain.operator.election import Election
from llmtrain.render import ImageSettings

DEFAULT_WORKERS = 16
DEFAULT_RESYNC_SECONDS = 120.0


@dataclass(frozen=True)
class OperatorConfig:
    images: ImageSettings = field(default_factory=ImageSettings)
    # Handler threads (Kopf runs sync handlers in a pool); the API client's connection pool matches.
    workers: int = DEFAULT_WORKERS
    # Every job's status is re-derived from its RayJob this often, whatever events were missed or
    # writes failed: the level-triggered safety net under the event-driven mirror.
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    # Several replicas: only the holder of this Lease acts (None: a single replica, no election).
    election: Election | None = None
