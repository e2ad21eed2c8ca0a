"""The three object stores seen the same way by the tests that run against each (s3 on versitygw,
gs on fake-gcs-server, az on Azurite): a `Store` names the server in spec.objectStorage (its
credentials as Secret references), holds the values those Secrets would have, and counts what the
server served. `started(scheme, folder)` starts one, with the buckets `corpus` and `models`.

`pod_env` is what a Ray container gets from spec.objectStorage: the renderer's own
`secret_env`/`plain_env` (rayjob.py), each secretKeyRef resolved from `secrets`, so a test that
runs the trainer with it passes credentials only the way a cluster does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmtrain.api.object_storage import ObjectStorageSpec

from tests.support.azure import ACCOUNT, azurite
from tests.support.gcs import fake_gcs_server
from tests.support.s3 import requests, versitygw

if TYPE_CHECKING:
    from pyarrow import fs as pafs

BUCKETS = ("corpus", "models")


@dataclass(frozen=True)
class Store:
    """One server, seen the same way for every scheme."""

    scheme: str
    env: dict[str, str]  # the server's own variables (endpoint and keys), as the pods would get them
    object_storage: dict[str, Any]  # spec.objectStorage naming this server, keys as Secret references
    secrets: dict[tuple[str, str], str]  # (Secret, key) -> the value those references name
    client: Callable[[], pafs.FileSystem]
    keys: Callable[[str], list[str]]
    downloads: Callable[[str, str], int]  # (bucket, key) -> GETs of the object's content
    uploads: Callable[[str, str], int]  # (bucket, key) -> whole uploads of it
    endpoint_env: str
    # Variables that keep a client off the network beyond the server (gs: a closed metadata server).
    isolation: dict[str, str] = field(default_factory=dict)

    @property
    def settings(self) -> ObjectStorageSpec:
        return ObjectStorageSpec.model_validate(self.object_storage)

    def pod_env(self) -> dict[str, str]:
        """The Ray containers' variables rendered from spec.objectStorage, Secrets resolved."""
        settings = self.settings
        env = {name: self.secrets[(ref.name, ref.key)] for name, ref in settings.secret_env().items()}
        return {**settings.plain_env(), **env, **self.isolation}

    def put(self, path: str, data: bytes) -> None:
        with self.client().open_output_stream(path) as out:
            out.write(data)

    def read(self, path: str) -> bytes:
        with self.client().open_input_stream(path) as body:
            return bytes(body.read())


@contextmanager
def _s3(folder: Path) -> Iterator[Store]:
    with versitygw(folder) as server:
        env = server.env
        yield Store(
            "s3",
            env,
            {
                "endpoint": server.endpoint,
                "region": env["AWS_REGION"],
                "accessKeySecretRef": {"name": "s3-creds", "key": "access-key"},
                "secretKeySecretRef": {"name": "s3-creds", "key": "secret-key"},
            },
            {
                ("s3-creds", "access-key"): env["AWS_ACCESS_KEY_ID"],
                ("s3-creds", "secret-key"): env["AWS_SECRET_ACCESS_KEY"],
            },
            server.client,
            server.keys,
            lambda _bucket, key: requests(server, "GetObject", key),
            lambda _bucket, key: requests(server, "CompleteMultipartUpload", key),
            "AWS_ENDPOINT_URL",
        )


@contextmanager
def _gcs(folder: Path) -> Iterator[Store]:
    with fake_gcs_server(folder) as server:
        env = server.env
        yield Store(
            "gs",
            env,
            {
                "gcs": {
                    "credentialsSecretRef": {"name": "gcs", "key": "key.json"},
                    "endpoint": server.endpoint,
                }
            },
            {("gcs", "key.json"): server.key},
            server.client,
            server.keys,
            server.downloads,
            server.uploads,
            "LLMTRAIN_GCS_ENDPOINT",
            {name: value for name, value in env.items() if name.startswith("GCE_METADATA")},
        )


@contextmanager
def _azure(folder: Path) -> Iterator[Store]:
    with azurite(folder) as server:
        yield Store(
            "az",
            server.env,
            {
                "azure": {
                    "accountName": ACCOUNT,
                    "accountKeySecretRef": {"name": "az", "key": "key"},
                    "endpoint": server.endpoint,
                }
            },
            {("az", "key"): server.key},
            server.client,
            server.keys,
            lambda bucket, key: server.requests("GET", bucket, key, "20[06]"),
            lambda bucket, key: server.requests("PUT", bucket, key, "201"),
            "LLMTRAIN_AZURE_ENDPOINT",
        )


SERVERS: dict[str, Callable[[Path], AbstractContextManager[Store]]] = {"s3": _s3, "gs": _gcs, "az": _azure}


@contextmanager
def started(scheme: str, folder: Path) -> Iterator[Store]:
    """The scheme's server on 127.0.0.1, its data under `folder`, with the buckets `corpus` and
    `models`; stopped when the block ends."""
    with SERVERS[scheme](folder) as store:
        for bucket in BUCKETS:
            store.client().create_dir(bucket)
        yield store
