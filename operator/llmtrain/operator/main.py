"""`llmtrain operator`: run the Kopf operator with probes, metrics and namespace scope."""

from __future__ import annotations

import argparse
import logging

import kopf
from prometheus_client import start_http_server

from llmtrain.operator import handlers, settings
from llmtrain.operator.config import OperatorConfig
from llmtrain.render import ImageSettings

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def config_from(args: argparse.Namespace) -> OperatorConfig:
    images = ImageSettings(trainer_image=args.trainer_image) if args.trainer_image else ImageSettings()
    return OperatorConfig(
        images=images,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        namespaces=tuple(args.namespace),
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
    config = config_from(args)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config)
    operator_settings = kopf.OperatorSettings()
    settings.configure(operator_settings, workers=config.workers)
    if args.metrics_port:
        start_http_server(args.metrics_port)
    kopf.run(
        registry=registry,
        settings=operator_settings,
        memo=kopf.Memo(config=config),
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
    )
    return 0
