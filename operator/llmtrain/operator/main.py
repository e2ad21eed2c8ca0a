"""`llmtrain operator`: run the Kopf operator with probes, metrics and namespace scope."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import kopf
from prometheus_client import start_http_server

from llmtrain.operator import handlers, kube, settings
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.election import Election, release, wait_until_leading
from llmtrain.render import ImageSettings

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


# Where a pod finds its own namespace.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ConfigError(ValueError):
    """A command line that cannot run, with the flag to fix."""


def _election(args: argparse.Namespace) -> Election | None:
    if not args.leader_elect:
        return None
    namespace = args.leader_election_namespace
    if not namespace and POD_NAMESPACE_FILE.exists():
        namespace = POD_NAMESPACE_FILE.read_text().strip()
    if not namespace:
        raise ConfigError("--leader-elect needs --leader-election-namespace outside a pod")
    if args.lease_seconds < 3:
        raise ConfigError("--lease-seconds must be at least 3")
    # client-go's proportions: renew within 2/3 of the lease, retry every 2/15 of it.
    return Election(
        lease_name=args.leader_election_name,
        lease_namespace=namespace,
        lease_seconds=args.lease_seconds,
        renew_deadline_seconds=max(2, args.lease_seconds * 2 // 3),
        retry_seconds=max(1, args.lease_seconds * 2 // 15),
    )


def config_from(args: argparse.Namespace) -> OperatorConfig:
    images = ImageSettings(pull_secrets=tuple(args.image_pull_secret))
    if args.trainer_image:
        images = dataclasses.replace(images, trainer_image=args.trainer_image)
    return OperatorConfig(
        images=images,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        namespaces=tuple(args.namespace),
        election=_election(args),
    )


def run_operator(args: argparse.Namespace) -> int:
    kopf.configure(
        debug=args.log_level == "debug",
        verbose=args.log_level != "warning",
        quiet=args.log_level == "warning",
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
        log_refkey="object",
    )
    logging.getLogger().setLevel(_LEVELS[args.log_level])
    try:
        config = config_from(args)
    except ConfigError as exc:
        logging.getLogger("llmtrain").error("%s", exc)
        return 2
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    operator_settings = kopf.OperatorSettings()
    settings.configure(operator_settings, workers=config.workers)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    holder = None
    if config.election is not None:
        kube.load_config()
        holder = wait_until_leading(config.election, liveness_port=args.liveness_port or None)
    kopf.run(
        registry=registry,
        settings=operator_settings,
        memo=kopf.Memo(config=config),
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
    )
    if config.election is not None and holder is not None:
        release(config.election, holder)
    return 0
