"""A real GCS-compatible server for the gs:// tests: fake-gcs-server, built from its Go module
(hack/tools/fake-gcs-server, like versitygw and the cluster tier's tools), serving a temporary
folder through its filesystem backend over http on 127.0.0.1, stopped with the test.

The trainer's client authenticates with a service-account key made here (a fresh RSA key; its
token_uri is a closed loopback port, so nothing leaves the machine): google-cloud-cpp signs its own
JWTs with it. fake-gcs-server does not check them, so `env` also points Google's metadata server at
a closed loopback port: a client that lost the key fails at once instead of asking a real one.
`client` is an anonymous admin filesystem that creates buckets and lists them back.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import builds
from tests.support.cluster.processes import free_port
from tests.support.s3 import REPO_ROOT
from tests.support.servers import bucket_keys, listening, settled_log

sys.path.insert(0, str(REPO_ROOT / "hack" / "tools"))
import build_tools as tools

if TYPE_CHECKING:
    from pyarrow import fs as pafs

PROJECT = "llmtrain-test"


def service_account_key(token_port: int) -> str:
    """A service-account key file's JSON with a fresh 2048-bit RSA key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return json.dumps(
        {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key_id": "llmtrain-test-key",
            "private_key": pem,
            "client_email": f"trainer@{PROJECT}.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": f"http://127.0.0.1:{token_port}/token",
        }
    )


@dataclass(frozen=True)
class GcsServer:
    endpoint: str
    root: Path  # the filesystem backend's folder
    log: Path  # the server's log: one access line per request it answered
    key: str  # the service-account key's JSON

    @property
    def env(self) -> dict[str, str]:
        """What spec.objectStorage.gcs's secretKeyRef and value entries give the Ray containers,
        and a closed metadata server (see the module's docstring)."""
        closed = self.endpoint.rsplit(":", 1)[0].removeprefix("http://") + ":1"
        return {
            "LLMTRAIN_GCS_CREDENTIALS": self.key,
            "LLMTRAIN_GCS_ENDPOINT": self.endpoint,
            "GCE_METADATA_ROOT": closed,
            "GCE_METADATA_HOST": closed,
        }

    def client(self) -> pafs.GcsFileSystem:
        from pyarrow import fs

        host = self.endpoint.removeprefix("http://")
        return fs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=host, project_id=PROJECT)

    def keys(self, bucket: str) -> list[str]:
        """Every object name of the bucket, listed through the JSON API."""
        return bucket_keys(self.client(), bucket)

    def _settled_log(self) -> list[str]:
        return settled_log(self.client(), self.log)

    def downloads(self, bucket: str, name: str) -> int:
        """How many media downloads of bucket/name the server answered."""
        needle = f"/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media"
        return sum(needle in line and '" 200 ' in line for line in self._settled_log())

    def uploads(self, bucket: str, name: str) -> int:
        """How many uploads of bucket/name the server answered (a resumable one counts once)."""
        quoted = re.escape(urllib.parse.quote(name, safe=""))
        pattern = re.compile(rf'"POST /upload/storage/v1/b/{bucket}/o\?\S*name={quoted}[&\s].*" 200 ')
        return sum(bool(pattern.search(line)) for line in self._settled_log())


@contextmanager
def fake_gcs_server(folder: Path, timeout: float = 60.0) -> Iterator[GcsServer]:
    """fake-gcs-server's filesystem backend on `folder`/data, over http on 127.0.0.1 only."""
    builds.tools_built()
    binary = tools.ensure("fake-gcs-server") / "fake-gcs-server"
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port)]
    command += ["-backend", "filesystem", "-filesystem-root", str(data), "-log-level", "info"]
    log = folder / "fake-gcs-server.log"
    with listening("fake-gcs-server", command, port, log, timeout=timeout):
        yield GcsServer(f"http://127.0.0.1:{port}", data, log, service_account_key(free_port()))
