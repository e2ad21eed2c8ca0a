"""Best-checkpoint tracking and early stopping on the validation loss (training.earlyStopping,
checkpoint.keepBest/exportBest).

The validation loss is all-reduced before it gets here, so every rank feeds the same numbers into
the same `EvalTracker` and reaches the same decision at the same step without a collective of its
own. The tracker's state travels in each checkpoint's `trainer_state.json`, so a restarted run
continues with the best loss, its step and the patience used so far as of the checkpoint it resumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from llmtrain.api.spec import EarlyStoppingSpec


@dataclass
class EvalTracker:
    """The lowest validation loss so far, where it was, and the evaluations since it improved."""

    best_loss: float | None = None
    best_step: int | None = None
    since_best: int = 0
    stopped: str | None = None
    """Why training stopped early; None while it goes on."""

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

    def is_best(self, step: int) -> bool:
        return self.best_step == step

    def to_dict(self) -> dict[str, Any]:
        return {"best_loss": self.best_loss, "best_step": self.best_step, "since_best": self.since_best}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> EvalTracker:
        """Also reads the state of a checkpoint written without one (no evaluation yet)."""
        data = data or {}
        best_loss, best_step = data.get("best_loss"), data.get("best_step")
        return cls(
            best_loss=None if best_loss is None else float(best_loss),
            best_step=None if best_step is None else int(best_step),
            since_best=int(data.get("since_best", 0)),
        )
