"""Object-store URIs (s3://, gs://, az://) in, and the export out, through pyarrow's filesystems.

In: before any worker starts, the driver copies each URI of dataset.path (and validationPath), model.name,
model.tokenizer and resumeFrom.checkpoint into a cache on the shared storage and hands the workers
the local copy, so ranks never download and a retry finds the copy. The cache key is the URI plus
each object's size and modification time (pyarrow reports no ETag), so a changed object is copied
again. A copy is written to a temporary folder and renamed into place, so a reader never sees a
partial copy and two drivers racing each keep a whole one.

Out: once the run finished and its export is complete, the driver copies the export to
checkpoint.exportTo, retrying a few times; a marker in the run directory makes it happen once.

Credentials come from the environment only (secretKeyRef entries on a cluster): s3 reads
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL and AWS_REGION; gs a service-account key's
JSON in LLMTRAIN_GCS_CREDENTIALS (written to a private file that GOOGLE_APPLICATION_CREDENTIALS names,
the only way pyarrow takes one) and LLMTRAIN_GCS_ENDPOINT; az AZURE_STORAGE_ACCOUNT_NAME,
AZURE_STORAGE_ACCOUNT_KEY and LLMTRAIN_AZURE_ENDPOINT. Each is tested against a real server:
versitygw, fake-gcs-server and Azurite (tests/support/).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from llmtrain.api.object_storage import (
    AZURE_ACCOUNT_ENV,
    AZURE_ENDPOINT_ENV,
    AZURE_KEY_ENV,
    ENDPOINT_ENV,
    GCS_CREDENTIALS_ENV,
    GCS_ENDPOINT_ENV,
    REGION_ENV,
    ObjectStorageSpec,
    is_object_uri,
)
from llmtrain.api.trainer_config import TrainerConfig

if TYPE_CHECKING:
    from pyarrow import fs as pafs

log = logging.getLogger(__name__)

CACHE_DIR = ".object-cache"
PUSHED_FILE = "export-pushed.json"
PUSH_ATTEMPTS = 4
# How long google-cloud-cpp retries one GCS call (its default is 15 minutes); the push has its own
# attempts, and a fetch that fails is the job's error, which the user should see soon.
GCS_RETRY_LIMIT = timedelta(seconds=30)


class ObjectStoreError(RuntimeError):
    """A URI could not be read or written; the message names it."""


def _endpoint(url: str) -> tuple[str, str]:
    """http://host:port/ -> ("http", "host:port"): what pyarrow's filesystems take."""
    proto, _, host = url.partition("://")
    return proto, host.rstrip("/")


_credential_files: dict[str, str] = {}


def _gcs_credentials_file(content: str) -> str:
    """A private (0600) file holding the service-account key, one per key and process, removed at
    exit: google-cloud-cpp (under pyarrow) reads a key only from the file that
    GOOGLE_APPLICATION_CREDENTIALS names."""
    digest = hashlib.sha256(content.encode()).hexdigest()
    if digest not in _credential_files:
        fd, name = tempfile.mkstemp(prefix="llmtrain-gcs-", suffix=".json")  # mode 0600
        with os.fdopen(fd, "w") as out:
            out.write(content)
        atexit.register(lambda: Path(name).unlink(missing_ok=True))
        _credential_files[digest] = name
    return _credential_files[digest]


def filesystem(uri: str, settings: ObjectStorageSpec | None = None) -> tuple[pafs.FileSystem, str]:
    """The filesystem serving `uri` and the path within it (bucket/key); the environment's
    endpoint and region win over spec.objectStorage's (`settings`)."""
    from pyarrow import fs

    scheme, _, path = uri.partition("://")
    path = path.rstrip("/")
    if scheme == "s3":
        endpoint = os.environ.get(ENDPOINT_ENV) or (settings.endpoint if settings else None)
        region = os.environ.get(REGION_ENV) or (settings.region if settings else "us-east-1")
        kwargs: dict[str, object] = {"region": region}
        if endpoint:
            proto, host = _endpoint(endpoint)
            kwargs.update(endpoint_override=host, scheme=proto)
        if os.environ.get("AWS_ACCESS_KEY_ID"):
            kwargs.update(
                access_key=os.environ["AWS_ACCESS_KEY_ID"],
                secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            )
        return fs.S3FileSystem(**kwargs), path
    if scheme == "gs":
        gcs = settings.gcs if settings else None
        endpoint = os.environ.get(GCS_ENDPOINT_ENV) or (gcs.endpoint if gcs else None)
        options: dict[str, object] = {}
        if endpoint:
            proto, host = _endpoint(endpoint)
            options.update(endpoint_override=host, scheme=proto)
        if credentials := os.environ.get(GCS_CREDENTIALS_ENV):
            os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = _gcs_credentials_file(credentials)
        elif not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
            # Google's default credentials would ask a metadata server and retry for minutes.
            raise ObjectStoreError(
                f"{uri}: no service-account key: set spec.objectStorage.gcs.credentialsSecretRef "
                f"({GCS_CREDENTIALS_ENV} is unset)"
            )
        return fs.GcsFileSystem(retry_time_limit=GCS_RETRY_LIMIT, **options), path
    if scheme == "az":
        azure = settings.azure if settings else None
        account = os.environ.get(AZURE_ACCOUNT_ENV) or (azure.account_name if azure else None)
        if not account:
            raise ObjectStoreError(f"{uri}: no storage account (spec.objectStorage.azure.accountName)")
        endpoint = os.environ.get(AZURE_ENDPOINT_ENV) or (azure.endpoint if azure else None)
        options = {"account_key": os.environ.get(AZURE_KEY_ENV) or None}
        if endpoint:  # an emulator or private endpoint serves blobs and the data-lake API alike
            proto, host = _endpoint(endpoint)
            options.update(
                blob_storage_authority=host,
                blob_storage_scheme=proto,
                dfs_storage_authority=host,
                dfs_storage_scheme=proto,
            )
        return fs.AzureFileSystem(account, **options), path
    raise ObjectStoreError(f"{uri}: not an s3://, gs:// or az:// URI")


def _listing(store: pafs.FileSystem, path: str, uri: str) -> list[pafs.FileInfo]:
    """The object at `path`, or every object under it when it is a prefix."""
    from pyarrow import fs

    info = store.get_file_info(path)
    if info.type == fs.FileType.File:
        return [info]
    if info.type == fs.FileType.NotFound:
        raise ObjectStoreError(f"{uri} does not exist (no object and no objects under it)")
    found = store.get_file_info(fs.FileSelector(path, recursive=True))
    files = sorted((i for i in found if i.type == fs.FileType.File), key=lambda i: i.path)
    if not files:
        raise ObjectStoreError(f"{uri} holds no objects")
    return files


def cache_key(uri: str, files: list[pafs.FileInfo]) -> str:
    """URI + each object's key, size and mtime: a changed object gives a new copy."""
    digest = hashlib.sha256(uri.encode())
    for info in files:
        mtime = info.mtime_ns if info.mtime_ns is not None else ""
        digest.update(f"\0{info.path}\0{info.size}\0{mtime}".encode())
    return digest.hexdigest()[:24]


def fetch(uri: str, cache_root: Path, settings: ObjectStorageSpec | None = None) -> Path:
    """The local copy of `uri` under `cache_root`, copied now only if no whole copy is there."""
    from pyarrow import fs

    try:
        store, path = filesystem(uri, settings)
        files = _listing(store, path, uri)
        target = cache_root / cache_key(uri, files)
        name = path.rsplit("/", 1)[-1]
        single = len(files) == 1 and files[0].path == path
        local = target / name
        if target.is_dir():
            log.info("%s: cached in %s", uri, local)
            return local
        cache_root.mkdir(parents=True, exist_ok=True)
        partial = cache_root / f".partial-{uuid.uuid4().hex}"
        partial.mkdir()
        started = time.monotonic()
        try:
            local_fs = fs.LocalFileSystem()
            if single:
                store_file = files[0].path
                fs.copy_files(store_file, str(partial / name), store, local_fs)
            else:
                for info in files:
                    dest = partial / name / info.path[len(path) :].lstrip("/")
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    fs.copy_files(info.path, str(dest), store, local_fs)
            try:
                partial.rename(target)  # atomic: readers see a whole copy or none
            except OSError:
                if not target.is_dir():
                    raise
                log.info("%s: another process cached it first", uri)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    except (OSError, ValueError) as exc:  # pyarrow's errors are OSError subclasses
        raise ObjectStoreError(f"{uri}: cannot copy it: {exc}") from exc
    total = sum(i.size or 0 for i in files)
    log.info(
        "%s: copied %d object(s), %d bytes, to %s in %.1f s",
        uri,
        len(files),
        total,
        local,
        time.monotonic() - started,
    )
    return local


def cache_root(config: TrainerConfig) -> Path:
    """<runs root>/.object-cache on the shared storage: one copy for every job of the namespace."""
    return Path(config.storage_path).parent / CACHE_DIR


def stage_inputs(config: TrainerConfig, resuming: bool = False) -> TrainerConfig:
    """`config` with each object URI replaced by its cached local copy (driver only, once)."""
    root, settings = cache_root(config), config.object_storage
    model, dataset, source = config.model, config.dataset, config.resume_from
    if is_object_uri(model.name):
        assert model.name is not None
        model = model.model_copy(update={"name": str(fetch(model.name, root, settings))})
    if is_object_uri(model.tokenizer):
        assert model.tokenizer is not None
        model = model.model_copy(update={"tokenizer": str(fetch(model.tokenizer, root, settings))})
    if is_object_uri(dataset.path):
        assert dataset.path is not None
        dataset = dataset.model_copy(update={"path": str(fetch(dataset.path, root, settings))})
    if is_object_uri(dataset.validation_path):
        assert dataset.validation_path is not None
        staged = str(fetch(dataset.validation_path, root, settings))
        dataset = dataset.model_copy(update={"validation_path": staged})
    # Only a run's first attempt reads resumeFrom: a retry resumes its own checkpoints.
    if source is not None and is_object_uri(source.checkpoint) and not resuming:
        assert source.checkpoint is not None
        source = source.model_copy(update={"checkpoint": str(fetch(source.checkpoint, root, settings))})
    return config.model_copy(update={"model": model, "dataset": dataset, "resume_from": source})


def push_export(
    config: TrainerConfig,
    attempts: int = PUSH_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Copy the finished export to checkpoint.exportTo once; the URI, or None when there is nothing
    to push. Retries with a growing pause; raises ObjectStoreError when every attempt failed."""
    destination = config.checkpoint.export_to
    export = Path(config.export_dir)
    if destination is None or not config.checkpoint.export:
        return None
    marker = Path(config.run_dir) / PUSHED_FILE
    if marker.exists() and json.loads(marker.read_text()).get("uri") == destination:
        log.info("export already pushed to %s", destination)
        return destination
    if not export.is_dir():
        raise ObjectStoreError(f"checkpoint.exportTo {destination}: there is no export in {export}")
    from pyarrow import fs

    error: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            store, path = filesystem(destination, config.object_storage)
            fs.copy_files(str(export), path, fs.LocalFileSystem(), store)
            marker.write_text(json.dumps({"uri": destination, "time": time.time()}) + "\n")
            log.info("export pushed to %s", destination)
            return destination
        except (OSError, ValueError) as exc:
            error = exc
            log.warning(
                "pushing the export to %s failed (attempt %d/%d): %s", destination, attempt, attempts, exc
            )
            if attempt < attempts:
                sleep(min(2.0**attempt, 30.0))
    raise ObjectStoreError(f"pushing the export to {destination} failed {attempts} times: {error}")
