"""checkpoint.pushToHub: upload the finished export to a Hugging Face Hub model repository.

The driver (or `llmtrain run`) calls `push_to_hub` once the run has finished and its export is
complete, after the checkpoint.exportTo copy. It creates the repository if missing
(`HfApi.create_repo(exist_ok=True)`), the branch when one is named, and uploads the export folder
as one commit (`HfApi.upload_folder`), retrying the whole sequence a few times with a growing pause
(huggingface_hub itself retries a 5xx answer to the preupload and commit requests, not to
create_repo or create_branch, and not a connection refused: this loop covers those and an outage
longer than its backoff). A commit whose answer was lost may be made twice; the content is the same.
A marker in the run directory (HUB_PUSHED_FILE, written only after the Hub answered the commit)
makes it happen once: a RayJob retry of the finished job, or `llmtrain run` again, returns the
recorded commit instead of committing again.

The token comes from HUB_TOKEN_ENV (a secretKeyRef on a cluster); when that is unset (e.g.
`llmtrain run` on a laptop) huggingface_hub's own lookup applies (HF_TOKEN, a saved login). The
endpoint comes from HF_ENDPOINT when set, so tests point it at a stand-in server on 127.0.0.1:
the real Hub is never contacted by the tests.

Xet is off for the push (`_lfs_only`): with the hf_xet package installed (it is in the trainer
image) huggingface_hub would send upload_folder through its Xet pipeline, which may split a large
folder into several commits and speaks a storage protocol the tests' Hub stand-in does not. With
Xet off it takes the single-commit path, large files through the Git LFS upload API, which the
real Hub still accepts and the tests exercise. huggingface_hub reads HF_HUB_DISABLE_XET from the
environment once, into `constants.HF_HUB_DISABLE_XET` when first imported, and `is_xet_available()`
reads that constant on every call: so the constant is what is set, only around the push.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from llmtrain.api.hub import HUB_ENDPOINT_ENV, HUB_TOKEN_ENV, HubPushSpec
from llmtrain.api.trainer_config import TrainerConfig

log = logging.getLogger(__name__)

HUB_PUSHED_FILE = "hub-pushed.json"
PUSH_ATTEMPTS = 4
DEFAULT_BRANCH = "main"


class HubPushError(RuntimeError):
    """The export could not be uploaded to the Hub; the message names the repository."""


def _target(spec: HubPushSpec) -> dict[str, str]:
    """What the marker must match for a recorded push to count: repository and branch."""
    return {"repo_id": spec.repo_id, "revision": spec.revision or DEFAULT_BRANCH}


@contextmanager
def _lfs_only() -> Iterator[None]:
    """Xet off for the duration of the block, restored after (see the module docstring). The push
    runs on one thread at the end of a run, so nothing else sees the change."""
    from huggingface_hub import constants

    before = constants.HF_HUB_DISABLE_XET
    constants.HF_HUB_DISABLE_XET = True
    try:
        yield
    finally:
        constants.HF_HUB_DISABLE_XET = before


def _upload(spec: HubPushSpec, export: Path, run_name: str) -> str:
    """One attempt: repository, branch, one commit of the whole folder; the commit's URL."""
    with _lfs_only():
        return _upload_lfs(spec, export, run_name)


def _upload_lfs(spec: HubPushSpec, export: Path, run_name: str) -> str:
    """_upload's requests, with Xet off."""
    from huggingface_hub import HfApi

    endpoint, token = os.environ.get(HUB_ENDPOINT_ENV), os.environ.get(HUB_TOKEN_ENV)
    api = HfApi(endpoint=endpoint or None, token=token or None)
    api.create_repo(spec.repo_id, repo_type="model", private=spec.private, exist_ok=True)
    if spec.revision and spec.revision != DEFAULT_BRANCH:
        api.create_branch(spec.repo_id, branch=spec.revision, repo_type="model", exist_ok=True)
    info = api.upload_folder(
        repo_id=spec.repo_id,
        folder_path=export,
        repo_type="model",
        revision=spec.revision,
        commit_message=f"llmtrain: export of run {run_name}",
    )
    return str(info.commit_url)


def push_to_hub(
    config: TrainerConfig,
    attempts: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """Upload the finished export to checkpoint.pushToHub once; the commit's URL, or None when
    there is nothing to push. Retries with a growing pause; raises HubPushError when every attempt
    failed (the export stays where it is, and a later call tries again)."""
    attempts = attempts or PUSH_ATTEMPTS  # read at call time: tests of the callers lower it
    spec = config.checkpoint.push_to_hub
    export = Path(config.export_dir)
    if spec is None or not config.checkpoint.export:
        return None
    marker = Path(config.run_dir) / HUB_PUSHED_FILE
    if marker.exists():
        recorded = json.loads(marker.read_text())
        if all(recorded.get(k) == v for k, v in _target(spec).items()) and recorded.get("commit_url"):
            log.info("export already pushed to the Hub: %s", recorded["commit_url"])
            return str(recorded["commit_url"])
    if not export.is_dir():
        raise HubPushError(f"checkpoint.pushToHub {spec.repo_id}: there is no export in {export}")
    import httpx2  # huggingface_hub's transport (a fork of httpx; httpx's errors are not its)
    from huggingface_hub.errors import HfHubHTTPError

    error: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            url = _upload(spec, export, config.run_name)
        except (HfHubHTTPError, httpx2.HTTPError, OSError, ValueError) as exc:
            error = exc  # an HTTP error answer, a connection failure, a malformed answer
        else:
            record = {**_target(spec), "commit_url": url, "time": time.time()}
            marker.write_text(json.dumps(record) + "\n")
            log.info("export pushed to the Hub: %s", url)
            return url
        log.warning(
            "pushing the export to the Hub repository %s failed (attempt %d/%d): %s",
            spec.repo_id,
            attempt,
            attempts,
            error,
        )
        if attempt < attempts:
            sleep(min(2.0**attempt, 30.0))
    raise HubPushError(
        f"pushing the export to the Hub repository {spec.repo_id} failed {attempts} times: {error}; "
        f"the export stays in {export}"
    )


def push_destinations(config: TrainerConfig) -> tuple[str | None, str | None, list[str]]:
    """checkpoint.exportTo, then checkpoint.pushToHub, each tried even when the other failed: the
    object URI and the Hub commit pushed (None where none was asked) and the failures' reasons."""
    from llmtrain_trainer.objstore import ObjectStoreError, push_export

    errors: list[str] = []
    uri = commit = None
    try:
        uri = push_export(config)
    except ObjectStoreError as exc:
        errors.append(str(exc))
    try:
        commit = push_to_hub(config)
    except HubPushError as exc:
        errors.append(str(exc))
    return uri, commit, errors
