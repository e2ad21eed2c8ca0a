"""Best-checkpoint tracking and early stopping on the validation loss (training.earlyStopping,
checkpoint.keepBest/exportBest).

The validation loss is all-reduced before it gets here, so every rank feeds the same numbers into
the same `EvalTracker` and reaches the same decision at the same step without a collective of its
own. The tracker's state travels in each checkpoint's `trainer_state.json`, so a restarted run
continues with the best loss, its step and the patience used so far as of the checkpoint it resumes.

Cadence (training.evalEverySteps): unset, the loss is evaluated at every checkpoint, as before.
Set, it is evaluated every evalEverySteps steps, and every one of those evaluations counts for
early stopping and for the best loss in status.progress. The *best checkpoint* (exportBest, and
keepBest's ranking) can only be a checkpoint that was evaluated at its own step, so the tracker
keeps it apart: with keepBest or exportBest, a checkpoint step always evaluates (the API requires
checkpoint.everySteps to be a multiple of evalEverySteps, so that adds at most the end-of-run
checkpoint), and a better loss at a step without a checkpoint lowers the best loss but not the best
checkpoint. This is also the Hugging Face Trainer's rule (best model only among saved checkpoints;
save_steps a multiple of eval_steps with load_best_model_at_end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmtrain.api.spec import EarlyStoppingSpec


def evaluates_at(step: int, eval_every: int | None, checkpoint_now: bool, ranks_checkpoints: bool) -> bool:
    """Whether the loop evaluates at `step`: every `eval_every` steps (training.evalEverySteps), or
    at each checkpoint when unset; a checkpoint that keepBest/exportBest ranks always evaluates."""
    if eval_every is None:
        return checkpoint_now
    return step % eval_every == 0 or (checkpoint_now and ranks_checkpoints)


@dataclass
class EvalTracker:
    """The lowest validation loss so far, where it was, and the evaluations since it improved."""

    best_loss: float | None = None
    best_step: int | None = None
    since_best: int = 0
    stopped: str | None = None
    """Why training stopped early; None while it goes on."""
    best_checkpoint_loss: float | None = None
    best_checkpoint_step: int | None = None
    """The best loss among evaluations taken at a checkpoint's step: the checkpoint exportBest loads."""

    def observe(self, step: int, loss: float, rule: EarlyStoppingSpec | None) -> bool:
        """Record the validation loss at `step`; True when training must stop now."""
        min_delta = rule.min_delta if rule is not None else 0.0
        if math.isfinite(loss) and (self.best_loss is None or loss < self.best_loss - min_delta):
            self.best_loss, self.best_step, self.since_best = loss, step, 0
        else:
            self.since_best += 1
        if rule is not None and self.since_best >= rule.patience:
            best = "none" if self.best_loss is None else f"{self.best_loss:.4f} at step {self.best_step}"
            self.stopped = (
                f"early stopping at step {step}: validation loss {loss:.4f} has not improved by more than "
                f"{min_delta:g} for {self.since_best} evaluations (training.earlyStopping.patience "
                f"{rule.patience}); best {best}"
            )
            return True
        return False

    def checkpointed(self, step: int, loss: float, rule: EarlyStoppingSpec | None) -> None:
        """A checkpoint is taken at `step`, evaluated at that step with `loss` (after `observe`)."""
        min_delta = rule.min_delta if rule is not None else 0.0
        best = self.best_checkpoint_loss
        if math.isfinite(loss) and (best is None or loss < best - min_delta):
            self.best_checkpoint_loss, self.best_checkpoint_step = loss, step

    def to_dict(self) -> dict[str, Any]:
        return {
            "best_loss": self.best_loss,
            "best_step": self.best_step,
            "since_best": self.since_best,
            "best_checkpoint_loss": self.best_checkpoint_loss,
            "best_checkpoint_step": self.best_checkpoint_step,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EvalTracker:
        """Also reads the state of a checkpoint written without one (no evaluation yet), or before
        evalEverySteps, when every evaluation was at a checkpoint (the best one is the best checkpoint)."""
        data = data or {}
        best_loss, best_step = data.get("best_loss"), data.get("best_step")
        ckpt_loss = data.get("best_checkpoint_loss", best_loss)
        ckpt_step = data.get("best_checkpoint_step", best_step)
        return cls(
            best_loss=None if best_loss is None else float(best_loss),
            best_step=None if best_step is None else int(best_step),
            since_best=int(data.get("since_best", 0)),
            best_checkpoint_loss=None if ckpt_loss is None else float(ckpt_loss),
            best_checkpoint_step=None if ckpt_step is None else int(ckpt_step),
        )
