"""A real Kopf operator (KopfRunner, in-process) against the server: the proof that Kopf works with it."""

from __future__ import annotations

import asyncio

from kopf.testing import KopfRunner

from tests.integration.apiserver import kopf_handlers, widgets
from tests.support.apiserver import ApiServer

API, KIND = widgets.API_VERSION, widgets.KIND
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


async def test_kopf_handles_a_create_once_and_a_delete_through_its_finalizer(
    bare_apiserver: ApiServer,
) -> None:
    await widgets.install(bare_apiserver)
    kopf_handlers.calls.clear()
    args = ["run", "--standalone", "--namespace=default"]

    with KopfRunner(args, registry=kopf_handlers.registry, timeout=60) as runner:
        await bare_apiserver.create(widgets.widget("w", size=3))
        ready = await bare_apiserver.wait_for(
            API,
            KIND,
            "default",
            "w",
            lambda o: o is not None and o.get("status", {}).get("phase") == "Ready",
            timeout=30,  # Kopf's start-up on a loaded CI machine
        )
        await asyncio.sleep(1)  # room for a second run, had a watch replayed the object as new
        assert kopf_handlers.calls == [("create", "w")]

        await bare_apiserver.delete(API, KIND, "default", "w")
        await bare_apiserver.wait_for(API, KIND, "default", "w", lambda o: o is None, timeout=30)

    assert runner.exception is None, runner.output
    assert runner.exit_code == 0, runner.output
    assert kopf_handlers.calls == [("create", "w"), ("delete", "w")]
    assert ready is not None
    assert ready["status"]["observedSize"] == 3  # written via /status: the main resource drops status
    assert FINALIZER in ready["metadata"]["finalizers"]
    assert ready["metadata"]["generation"] == 1  # Kopf's own writes went to status and metadata only
