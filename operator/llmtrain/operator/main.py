"""`llmtrain operator`: run the Kopf operator with probes, metrics and namespace scope."""

from __future__ import annotations

import logging

import kopf
from prometheus_client import start_http_server

from llmtrain.operator import discovery, kube, registration, settings, slim
from llmtrain.operator.config import OperatorConfig
from llmtrain.operator.election import release, wait_until_leading
from llmtrain.operator.metrics import LEADER, PHASE_BOOK

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def run_operator(config: OperatorConfig) -> int:
    kopf.configure(
        debug=config.log_level == "debug",
        verbose=config.log_level != "warning",
        quiet=config.log_level == "warning",
        log_format=kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.PLAIN,
        log_refkey="object",
    )
    logging.getLogger().setLevel(_LEVELS[config.log_level])
    discovery.serve_late_crds()
    slim.install()
    registry = kopf.OperatorRegistry()
    registration.register(registry)
    operator_settings = kopf.OperatorSettings()
    settings.configure(operator_settings, workers=config.workers, clusterwide=not config.namespaces)
    if config.metrics_port:
        start_http_server(config.metrics_port)
    holder = None
    if config.election is not None:
        kube.load_config()
        holder = wait_until_leading(config.election, liveness_port=config.liveness_port or None)
    LEADER.set(1)
    PHASE_BOOK.start()
    liveness = f"http://0.0.0.0:{config.liveness_port}/healthz" if config.liveness_port else None
    kopf.run(
        registry=registry,
        settings=operator_settings,
        memo=kopf.Memo(config=config),
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        liveness_endpoint=liveness,
    )
    if config.election is not None and holder is not None:
        release(config.election, holder)
    return 0
