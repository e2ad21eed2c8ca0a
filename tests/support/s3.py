"""A real S3-compatible server for the object-storage tests: versitygw, built from its Go module
(hack/tools/versitygw, like the cluster tier's tools), serving a temporary folder through its
posix backend on 127.0.0.1 with a root access key, stopped with the test.

`s3_env` is the environment the trainer's client reads (the variables the renderer injects from
spec.objectStorage on a cluster); `s3_client` is pyarrow's S3 filesystem on the server, for the
tests to put and list objects through the S3 API.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support import builds
from tests.support.cluster.processes import free_port
from tests.support.servers import bucket_keys, listening

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "hack" / "tools"))
import build_tools as tools  # noqa: E402

if TYPE_CHECKING:
    from pyarrow import fs as pafs

ACCESS_KEY = "llmtrain-test"
SECRET_KEY = "llmtrain-test-secret"  # the throwaway root key of a loopback-only server
REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    root: Path  # the posix backend's folder: one subfolder per bucket
    access_log: Path  # the server's access log: one line per request it answered

    @property
    def env(self) -> dict[str, str]:
        """What spec.objectStorage's secretKeyRef and value entries give the Ray containers."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
        }

    def client(self) -> pafs.S3FileSystem:
        from pyarrow import fs

        return fs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=self.endpoint.removeprefix("http://"),
            scheme="http",
            allow_bucket_creation=True,
        )

    def keys(self, bucket: str) -> list[str]:
        """Every object key of the bucket, listed through the S3 API (ListObjectsV2)."""
        return bucket_keys(self.client(), bucket)


def _as_is(argv: list[str]) -> list[str]:
    return argv


@contextmanager
def versitygw(
    folder: Path,
    timeout: float = 60.0,
    *,
    host: str = "127.0.0.1",
    enter: Callable[[list[str]], list[str]] = _as_is,
) -> Iterator[S3Server]:
    """versitygw's posix backend on `folder`/data, listening on `host` only: loopback, or with
    `enter` (a real node's `NodeNetwork.enter`) the node's IP inside its network namespace, where
    the node's pods reach it."""
    builds.tools_built()
    binary = tools.ensure("versitygw") / "versitygw"
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    access_log = folder / "access.log"
    command = [str(binary), "--access", ACCESS_KEY, "--secret", SECRET_KEY, "--region", REGION]
    command += ["--access-log", str(access_log), "--quiet"]
    command += ["--port", f"{host}:{port}", "posix", str(data)]
    log_path = folder / "versitygw.log"
    with listening("versitygw", enter(command), port, log_path, timeout=timeout, host=host):
        yield S3Server(f"http://{host}:{port}", data, access_log)


def requests(server: S3Server, operation: str, key: str) -> int:
    """How many `operation` requests (e.g. GetObject) for `key` the server answered."""
    needle = f" s3_{operation} {key} "
    return sum(needle in line for line in server.access_log.read_text().splitlines())
