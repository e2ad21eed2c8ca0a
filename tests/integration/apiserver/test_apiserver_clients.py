"""The official `kubernetes` client finds the server through the fixture's kubeconfig, with no arguments."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from tests.integration.apiserver import widgets
from tests.support.apiserver import ApiServer


async def test_the_official_client_works_against_the_server(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]  # the default location, as Kopf's
    assert kubernetes.client.Configuration.get_default_copy().host == bare_apiserver.url
    core = kubernetes.client.CoreV1Api()
    custom = kubernetes.client.CustomObjectsApi()
    configmap = kubernetes.client.V1ConfigMap(
        metadata=kubernetes.client.V1ObjectMeta(name="cm"), data={"a": "1"}
    )

    # Blocking calls are fine: the server runs in its own thread.
    created = core.create_namespaced_config_map("default", configmap)
    names = [ns.metadata.name for ns in core.list_namespace().items if ns.metadata]
    widget: Any = custom.create_namespaced_custom_object(
        "example.com", "v1", "default", "widgets", widgets.widget()
    )
    status: Any = core.delete_namespaced_config_map("cm", "default")  # client 37 returns a plain dict here
    with pytest.raises(kubernetes.client.ApiException) as missing:
        core.read_namespaced_config_map("cm", "default")

    assert created.metadata is not None and created.metadata.uid
    assert "default" in names
    assert widget["spec"]["color"] == "red"  # defaulted by the CRD's schema
    assert status["status"] == "Success"
    assert missing.value.status == 404
