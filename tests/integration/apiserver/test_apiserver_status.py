"""The status subresource splits an object: `/status` writes only status, the main resource never does."""

from __future__ import annotations

from tests.integration.apiserver import widgets
from tests.support.apiserver import ApiServer

API, KIND = widgets.API_VERSION, widgets.KIND


async def test_create_drops_status(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    created = await bare_apiserver.create({**widgets.widget(), "status": {"phase": "Done"}})
    assert "status" not in created


async def test_a_status_write_cannot_change_spec_or_metadata(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    await bare_apiserver.create(widgets.widget(size=1))

    result = await bare_apiserver.patch_status(
        API,
        KIND,
        "default",
        "w",
        {"spec": {"size": 50}, "metadata": {"labels": {"sneaky": "yes"}}, "status": {"phase": "Running"}},
    )

    assert result["status"] == {"phase": "Running"}
    assert result["spec"]["size"] == 1
    assert "labels" not in result["metadata"]
    assert bare_apiserver.stored(API, KIND, "default", "w") == result


async def test_a_main_resource_write_cannot_change_status(bare_apiserver: ApiServer) -> None:
    await widgets.install(bare_apiserver)
    await bare_apiserver.create(widgets.widget(size=1))
    await bare_apiserver.patch_status(API, KIND, "default", "w", {"status": {"phase": "Running"}})

    patched = await bare_apiserver.patch(
        API, KIND, "default", "w", {"spec": {"size": 2}, "status": {"phase": "X"}}
    )
    replaced = await bare_apiserver.replace({**patched, "status": None})

    for result in (patched, replaced):
        assert result["status"] == {"phase": "Running"}
    assert patched["spec"]["size"] == 2


async def test_without_a_status_subresource_status_is_ordinary_content(bare_apiserver: ApiServer) -> None:
    await bare_apiserver.install_crd(widgets.crd(status_subresource=False))
    created = await bare_apiserver.create({**widgets.widget(), "status": {"phase": "Done"}})
    status_url = await bare_apiserver.request("GET", bare_apiserver.path(API, KIND, "default", "w", "status"))

    assert created["status"] == {"phase": "Done"}
    assert status_url.status == 404
