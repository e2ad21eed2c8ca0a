"""The early-stopping decision and best-checkpoint tracking (evaluation.EvalTracker), and their
mapping onto the Hugging Face Trainer (hf_args)."""

from __future__ import annotations

import math

from llmtrain.api.spec import EarlyStoppingSpec
from llmtrain_trainer.checkpoint import TrainerState
from llmtrain_trainer.evaluation import EvalTracker, evaluates_at


def feed(tracker: EvalTracker, losses: list[float], rule: EarlyStoppingSpec | None) -> int | None:
    """The step (10 per evaluation) at which the tracker says stop, None if never."""
    for i, loss in enumerate(losses, start=1):
        if tracker.observe(10 * i, loss, rule):
            return 10 * i
    return None


def test_patience_counts_evaluations_without_improvement() -> None:
    tracker = EvalTracker()
    stop = feed(tracker, [3.0, 2.0, 2.5, 2.4, 2.1, 1.0], EarlyStoppingSpec(patience=3))
    assert stop == 50
    assert (tracker.best_loss, tracker.best_step) == (2.0, 20)
    assert tracker.stopped is not None and "step 50" in tracker.stopped and "patience 3" in tracker.stopped


def test_an_improvement_resets_the_patience() -> None:
    tracker = EvalTracker()
    assert feed(tracker, [3.0, 3.1, 2.9, 3.0, 2.8, 2.9], EarlyStoppingSpec(patience=2)) is None
    assert (tracker.best_loss, tracker.best_step, tracker.since_best) == (2.8, 50, 1)


def test_min_delta_ignores_small_improvements() -> None:
    tracker = EvalTracker()
    # 1.95 and 1.92 are below the best but not by more than 0.1: no improvement.
    assert feed(tracker, [2.0, 1.95, 1.92], EarlyStoppingSpec(patience=2, min_delta=0.1)) == 30
    assert tracker.best_step == 10
    tracker = EvalTracker()
    assert feed(tracker, [2.0, 1.85, 1.7], EarlyStoppingSpec(patience=2, min_delta=0.1)) is None
    assert tracker.best_step == 30


def test_without_a_rule_only_the_best_is_tracked() -> None:
    tracker = EvalTracker()
    assert feed(tracker, [2.0, 1.0, 5.0, 6.0, 7.0, 8.0], None) is None
    assert (tracker.best_loss, tracker.best_step) == (1.0, 20)


def test_a_diverged_loss_is_never_the_best() -> None:
    tracker = EvalTracker()
    assert feed(tracker, [2.0, math.nan, math.inf], EarlyStoppingSpec(patience=2)) == 30
    assert tracker.best_step == 10
    fresh = EvalTracker()
    assert not fresh.observe(10, math.nan, None)
    assert fresh.best_step is None


def test_a_restart_continues_from_the_checkpoints_state() -> None:
    """The tracker's state rides in trainer_state.json: a resumed run keeps the best and the
    patience already used, and stops where an uninterrupted run would."""
    rule = EarlyStoppingSpec(patience=3)
    losses = [3.0, 2.0, 2.5, 2.4, 2.1]
    whole = EvalTracker()
    assert feed(whole, losses, rule) == 50
    first = EvalTracker()
    assert feed(first, losses[:3], rule) is None
    state = TrainerState(step=30, evaluation=first.to_dict())
    restored = TrainerState.from_dict(state.to_dict())
    resumed = EvalTracker.from_dict(restored.evaluation)
    assert (resumed.best_loss, resumed.best_step, resumed.since_best) == (2.0, 20, 1)
    assert not resumed.observe(40, 2.4, rule)
    assert resumed.observe(50, 2.1, rule)


def test_a_checkpoint_without_evaluation_state_starts_fresh() -> None:
    state = TrainerState.from_dict({"step": 5})
    assert EvalTracker.from_dict(state.evaluation) == EvalTracker()


def test_the_cadence_evaluates_every_n_steps_or_at_checkpoints() -> None:
    """Unset: at checkpoints only. Set: every N steps; a checkpoint off that grid evaluates only
    when keepBest/exportBest rank it (its score must be its own step's loss)."""
    assert [s for s in range(1, 31) if evaluates_at(s, None, s % 10 == 0, False)] == [10, 20, 30]
    assert [s for s in range(1, 31) if evaluates_at(s, 4, s % 10 == 0, False)] == [4, 8, 12, 16, 20, 24, 28]
    # The end-of-run checkpoint (step 30, off the grid of 4) is scored when ranked.
    ranked = [s for s in range(1, 31) if evaluates_at(s, 4, s % 10 == 0 or s == 30, True)]
    assert ranked == [4, 8, 10, 12, 16, 20, 24, 28, 30]


def test_only_evaluations_at_checkpoints_mark_the_best_checkpoint() -> None:
    """A better loss between checkpoints lowers the best loss (status, early stopping) but the best
    checkpoint stays the best one that exists; both survive a restart."""
    rule = EarlyStoppingSpec(patience=5, min_delta=0.01)
    tracker = EvalTracker()
    for step, loss in [(5, 3.0), (10, 2.5), (15, 1.0), (20, 2.0), (25, 2.2), (30, 1.995)]:
        tracker.observe(step, loss, rule)
        if step % 10 == 0:
            tracker.checkpointed(step, loss, rule)
    assert (tracker.best_loss, tracker.best_step) == (1.0, 15)
    # 1.995 at step 30 is not better than 2.0 by more than minDelta: step 20 stays the best checkpoint.
    assert (tracker.best_checkpoint_loss, tracker.best_checkpoint_step) == (2.0, 20)
    restored = EvalTracker.from_dict(
        TrainerState.from_dict(TrainerState(evaluation=tracker.to_dict()).to_dict()).evaluation
    )
    assert restored == tracker


def test_a_checkpoint_from_before_the_cadence_setting_keeps_its_best_checkpoint() -> None:
    """Its evaluations were all at checkpoints: the best one was a checkpoint."""
    old = EvalTracker.from_dict({"best_loss": 1.5, "best_step": 40, "since_best": 2})
    assert (old.best_checkpoint_loss, old.best_checkpoint_step) == (1.5, 40)
