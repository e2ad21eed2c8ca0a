"""The operator's API client: one pooled connection per handler thread."""

from __future__ import annotations

import pytest
from kubernetes import config
from llmtrain.operator.kube import Kube


def test_the_connection_pool_matches_the_handler_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_in_a_pod() -> None:
        raise config.ConfigException("not in a pod")

    monkeypatch.setattr(config, "load_incluster_config", not_in_a_pod)
    monkeypatch.setattr(config, "load_kube_config", lambda: None)

    kube = Kube.from_environment(connections=24)

    assert kube.api.configuration.connection_pool_maxsize == 24
