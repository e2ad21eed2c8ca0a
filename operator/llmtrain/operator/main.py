"""`llmtrain operator`: run the Kopf operator with probes, metrics and namespace scope."""

from __future__ import annotations

import argparse
import logging
import os

import kopf
from prometheus_client import start_http_server

from llmtrain.operator.handlers import TRAINER_IMAGE_ENV

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def run_operator(args: argparse.Namespace) -> int:
    kopf.configure(
        debug=args.log_level == "debug",
        verbose=args.log_level != "warning",
        quiet=args.log_level == "warning",
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
        log_refkey="object",
    )
    logging.getLogger().setLevel(_LEVELS[args.log_level])
    if args.trainer_image:
        os.environ[TRAINER_IMAGE_ENV] = args.trainer_image
    if args.metrics_port:
        start_http_server(args.metrics_port)
    namespaces = list(args.namespace)
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None,
    )
    return 0
