"""The operator's configuration, in one place: its type, its command-line flags and their defaults,
their validation, and the loading from a parsed command line.

`llmtrain operator` builds one `OperatorConfig` here and hands it to `main.run_operator`; the
handlers read it from Kopf's memo, never from the environment. This module imports nothing heavy
(no Kopf, no kubernetes client, no urllib3): the core CLI adds these flags to its parser, and
`llmtrain validate`, `render` and `crd` must work with only the core install.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from llmtrain.api.spec import STARTUP_BACKSTOP_SECONDS
from llmtrain.constants import (
    MIN_RAY_VERSION,
    OPERATOR_NAME,
    RAY_VERSION,
    SUPPORTED_RAY_VERSION_PATTERN,
)
from llmtrain.render import ImageSettings

DEFAULT_WORKERS = 16
DEFAULT_RESYNC_SECONDS = 120.0
DEFAULT_STARTUP_LOOK_SECONDS = 15.0
DEFAULT_LEASE_SECONDS = 15
MIN_LEASE_SECONDS = 3
DEFAULT_LIVENESS_PORT = 8080
DEFAULT_METRICS_PORT = 9090
LogLevel = Literal["debug", "info", "warning"]
LogFormat = Literal["json", "plain"]
LOG_LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warning")
LOG_FORMATS: tuple[LogFormat, ...] = ("json", "plain")

# Where a pod finds its own namespace (the Lease's, unless a flag names one).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ConfigError(ValueError):
    """A command line that cannot run, with the flag to fix."""


@dataclass(frozen=True)
class Election:
    """Where the Lease lives and its timing (client-go's defaults: 15 s, 10 s, 2 s)."""

    lease_name: str
    lease_namespace: str
    identity: str = ""
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    renew_deadline_seconds: int = 10
    retry_seconds: int = 2

    @classmethod
    def for_lease(cls, name: str, namespace: str, lease_seconds: int) -> Election:
        """client-go's proportions: renew within 2/3 of the lease, retry every 2/15 of it."""
        if lease_seconds < MIN_LEASE_SECONDS:
            raise ConfigError(f"--lease-seconds must be at least {MIN_LEASE_SECONDS}")
        return cls(
            lease_name=name,
            lease_namespace=namespace,
            lease_seconds=lease_seconds,
            renew_deadline_seconds=max(2, lease_seconds * 2 // 3),
            retry_seconds=max(1, lease_seconds * 2 // 15),
        )

    @property
    def request_seconds(self) -> float:
        """Each Lease call's timeout: two calls (read, then write) fit in one renew deadline."""
        return self.renew_deadline_seconds / 2

    def holder(self) -> str:
        """Unique per process: the pod name (hostname) plus a random suffix, so a restarted
        container never mistakes its predecessor's lease for its own."""
        return self.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class OperatorConfig:
    images: ImageSettings = field(default_factory=ImageSettings)
    # Handler threads (Kopf runs sync handlers in a pool); the API client's connection pool matches.
    workers: int = DEFAULT_WORKERS
    # Every job's status is re-derived from its RayJob this often, whatever events were missed or
    # writes failed: the level-triggered safety net under the event-driven mirror.
    resync_seconds: float = DEFAULT_RESYNC_SECONDS
    # Jobs whose Ray cluster is starting are looked at this often: their RayJob does not change
    # while pods wait on an image, a Secret or a node, so no event would bring the cause.
    startup_look_seconds: float = DEFAULT_STARTUP_LOOK_SECONDS
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    # Several replicas: only the holder of this Lease acts (None: a single replica, no election).
    election: Election | None = None
    liveness_port: int = DEFAULT_LIVENESS_PORT  # 0: no /healthz
    metrics_port: int = DEFAULT_METRICS_PORT  # 0: no /metrics
    log_level: LogLevel = "info"
    log_format: LogFormat = "json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`llmtrain operator`'s flags; every default is this module's."""
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--all-namespaces", "-A", action="store_true", default=False, help="watch every namespace (default)"
    )
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)"
    )
    numbers: tuple[tuple[str, type[int] | type[float], float, str], ...] = (
        ("--liveness-port", int, DEFAULT_LIVENESS_PORT, "serves /healthz (0 disables)"),
        ("--metrics-port", int, DEFAULT_METRICS_PORT, "serves Prometheus /metrics (0 disables)"),
        ("--workers", int, DEFAULT_WORKERS, "handler threads (and API connections)"),
        (
            "--resync-seconds",
            float,
            DEFAULT_RESYNC_SECONDS,
            "re-derive every job's status from its RayJob this often (missed events, failed writes)",
        ),
        (
            "--startup-look-seconds",
            float,
            DEFAULT_STARTUP_LOOK_SECONDS,
            "look again this often at what keeps a starting job's Ray cluster from starting",
        ),
        (
            "--lease-seconds",
            int,
            DEFAULT_LEASE_SECONDS,
            "a leader that stops renewing is replaced after this",
        ),
    )
    for flag, kind, default, text in numbers:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument("--log-format", choices=LOG_FORMATS, default="json")
    parser.add_argument("--trainer-image", help="default trainer image for jobs that set none")
    parser.add_argument(
        "--trainer-ray-version",
        default=RAY_VERSION,
        help="the Ray version the default trainer image installs (the RayJob's rayVersion; a job with "
        "its own image names its own in spec.resources.rayVersion)",
    )
    parser.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        help="a Secret (in each job's namespace) every trainer pod pulls with (repeatable)",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="stand by until this process holds a coordination.k8s.io Lease (several replicas)",
    )
    parser.add_argument("--leader-election-name", default=OPERATOR_NAME, help="the Lease's name")
    parser.add_argument(
        "--leader-election-namespace", help="the Lease's namespace (default: the pod's own namespace)"
    )


def _election(args: argparse.Namespace) -> Election | None:
    if not args.leader_elect:
        return None
    namespace = args.leader_election_namespace
    if not namespace and POD_NAMESPACE_FILE.exists():
        namespace = POD_NAMESPACE_FILE.read_text().strip()
    if not namespace:
        raise ConfigError("--leader-elect needs --leader-election-namespace outside a pod")
    return Election.for_lease(args.leader_election_name, namespace, args.lease_seconds)


def from_args(args: argparse.Namespace) -> OperatorConfig:
    """The configuration a parsed `llmtrain operator` command line asks for; ConfigError names the
    flag to fix, before anything connects."""
    if args.workers < 1:
        raise ConfigError("--workers must be at least 1")
    if args.resync_seconds <= 0:
        raise ConfigError("--resync-seconds must be positive")
    if args.startup_look_seconds <= 0:
        raise ConfigError("--startup-look-seconds must be positive")
    if args.startup_look_seconds >= STARTUP_BACKSTOP_SECONDS:
        # KubeRay's preRunningDeadlineSeconds would then fire first, and KubeRay retries it.
        raise ConfigError(
            f"--startup-look-seconds must be below {STARTUP_BACKSTOP_SECONDS} s, the time KubeRay's "
            "own start-up deadline leaves the operator"
        )
    if not re.match(SUPPORTED_RAY_VERSION_PATTERN, args.trainer_ray_version):
        raise ConfigError(
            f"--trainer-ray-version {args.trainer_ray_version!r} must be the default trainer image's Ray "
            f"release as X.Y.Z, {'.'.join(map(str, MIN_RAY_VERSION))} or later (Ray token authentication)"
        )
    images = ImageSettings(pull_secrets=tuple(args.image_pull_secret), ray_version=args.trainer_ray_version)
    if args.trainer_image:
        images = dataclasses.replace(images, trainer_image=args.trainer_image)
    return OperatorConfig(
        images=images,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        startup_look_seconds=args.startup_look_seconds,
        namespaces=tuple(args.namespace),
        election=_election(args),
        liveness_port=args.liveness_port,
        metrics_port=args.metrics_port,
        log_level=args.log_level,
        log_format=args.log_format,
    )
