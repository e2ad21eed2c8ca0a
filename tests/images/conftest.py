"""Every test here builds with buildah or uses the built images: it waits for `make test`'s
background image build first (tests/support/builds.py)."""

from __future__ import annotations

import pytest

from tests.support import builds


@pytest.fixture(autouse=True, scope="session")
def _images_built() -> None:
    builds.images_built()
