"""A real Azure Blob Storage server for the az:// tests: Azurite, the Azure Storage emulator,
installed from its pinned npm package (hack/node_tools/azurite, cached outside the work tree like
the Go tools), its blob service over http on 127.0.0.1 with an account and key made here, stopped
with the test. Telemetry is off (Azurite would otherwise send some to Microsoft).

Azurite checks the shared-key signature of every request, so a client without the right key is
refused. `env` is what spec.objectStorage.azure gives the Ray containers; `client` is pyarrow's
Azure filesystem on the server, for the tests to create containers and list them back.
"""

from __future__ import annotations

import base64
import re
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.cluster.processes import free_port
from tests.support.s3 import REPO_ROOT
from tests.support.servers import bucket_keys, listening, settled_log

sys.path.insert(0, str(REPO_ROOT / "hack" / "node_tools"))
import node_tools

if TYPE_CHECKING:
    from pyarrow import fs as pafs

ACCOUNT = "llmtraintest"


@dataclass(frozen=True)
class AzureServer:
    endpoint: str
    log: Path  # Azurite's output: one access line per request it answered
    key: str  # the account's key (base64), made for this server

    @property
    def env(self) -> dict[str, str]:
        """What spec.objectStorage.azure's secretKeyRef and value entries give the Ray containers."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": self.key,
            "LLMTRAIN_AZURE_ENDPOINT": self.endpoint,
        }

    def client(self) -> pafs.AzureFileSystem:
        from pyarrow import fs

        host = self.endpoint.removeprefix("http://")
        return fs.AzureFileSystem(
            ACCOUNT,
            account_key=self.key,
            blob_storage_authority=host,
            blob_storage_scheme="http",
            dfs_storage_authority=host,
            dfs_storage_scheme="http",
        )

    def keys(self, container: str) -> list[str]:
        """Every blob name of the container, listed through the blob API."""
        return bucket_keys(self.client(), container)

    def _settled_log(self) -> list[str]:
        return settled_log(self.client(), self.log)

    def requests(self, method: str, container: str, name: str, status: str) -> int:
        """How many `method` requests for the blob itself (no query: a download or a whole upload)
        Azurite answered with a status matching `status` (a regex: a ranged download is a 206)."""
        pattern = re.compile(rf'"{method} /{ACCOUNT}/{container}/{re.escape(name)} HTTP/[\d.]+" {status} ')
        return sum(bool(pattern.search(line)) for line in self._settled_log())


@contextmanager
def azurite(folder: Path, timeout: float = 60.0) -> Iterator[AzureServer]:
    """Azurite's blob service, its data in `folder`/data, on 127.0.0.1 only."""
    binary = node_tools.ensure("azurite") / "node_modules" / ".bin" / "azurite-blob"
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    port = free_port()
    key = base64.b64encode(secrets.token_bytes(64)).decode()
    command = [str(binary), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(data)]
    command += ["--disableTelemetry", "--skipApiVersionCheck", "--loose"]
    env = dict(node_tools.node_env(), AZURITE_ACCOUNTS=f"{ACCOUNT}:{key}")
    log = folder / "azurite.log"
    with listening("azurite", command, port, log, env=env, timeout=timeout):
        yield AzureServer(f"http://127.0.0.1:{port}", log, key)
