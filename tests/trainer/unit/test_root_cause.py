"""The driver's one-line root cause of a failed run, as the operator shows it."""

from __future__ import annotations

from llmtrain_trainer.main import root_cause


class _RayWrapped(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"ray task failed\n{cause}")
        self.cause = cause


class _TrainingFailed(Exception):
    def __init__(self, failures: dict[int, BaseException]) -> None:
        super().__init__("training failed")
        self.worker_failures = failures


class OutOfMemoryError(RuntimeError):
    pass


def test_lowest_failing_rank_and_unwrapped_error_class() -> None:
    exc = _TrainingFailed(
        {
            3: _RayWrapped(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")),
            5: _RayWrapped(RuntimeError("NCCL watchdog timeout")),
        }
    )
    assert root_cause(exc) == "OutOfMemoryError on rank 3: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_controller_failure_without_ranks() -> None:
    assert (
        root_cause(RuntimeError("placement group timed out\n")) == "RuntimeError: placement group timed out"
    )
