"""`Controller`: Orbit's outer loop with orbitask's checkpoint rules and a safe restore.

With none of its own options set it is `orbit.Controller` (Orbit's own controller_test passes
against it). All the work between device loops is one `actions.schedule.Schedule`: the entries
given as `periodic`, Orbit's `train_actions`, then the Controller's own `summaries`,
`checkpoint` and (in `train_and_evaluate`) `evaluation` entries. Device loops end where a
loop-ending entry is due. Its additions:

- `checkpoint_interval` / `checkpoint_seconds` / `save_at_completion`: saves at exact multiples
  of the interval (Orbit's manager counts from the first save: 1, 1+k, ...), after the first
  device loop that ends `checkpoint_seconds` after the last save (under
  `multi_worker_mirrored` every worker saves when any worker's clock says so), and always at
  completion: the `checkpoint` entry. Device loops end at interval multiples.
- `restore_checkpoint` restores the newest *readable* checkpoint (a corrupt latest one is
  skipped with a warning, never deleted), or calls the manager's `init_fn` when there is none.
- `on_loop(steps, seconds)` receives each device loop's wall time (the runner's `LoopLength`).
- The training loop reads the global step once per device loop (Orbit reads it several times,
  and flushes the summary writer around each loop).
- `train_and_evaluate` evaluates at the multiples of `eval_interval` counted from step 0 (and at
  `train_steps`), whatever step the run starts from: the `evaluation` entry, last in the
  schedule (`actions.evaluation_points`). Orbit counts the interval from the starting step, so
  a run resumed at 350 would evaluate at 550, 750.
- `evaluated_step`, a checkpointed variable: each evaluation of `train_and_evaluate` sets it to
  its step before the eval actions run, so a checkpoint saved after an evaluation (by an eval
  action, or any later save) records it. A run resumed from a checkpoint whose record is older
  than the newest evaluation point at or before its step evaluates first, at that step. A
  negative record means none (a fresh run, or a checkpoint written by `--mode=train`): the
  schedule starts at the restored step, and with `eval_at_start` a baseline evaluation runs
  there first (so once per run: its record is then saved).
- Training goes on from the step after each evaluation (an eval action may move the step
  back: `ValidationControl.go_back`).
- `train_and_evaluate(..., eval_seconds=T)` also evaluates at the end of the first device loop
  that ends T seconds of training after the last evaluation (evaluation time not counted),
  on every worker when any worker's clock says so (the schedule's one agreement after each
  loop, `cluster.largest_each`, as for the checkpoint time rule and the signals received).
  Such a point depends on the clock: a resumed run evaluates at the steps its own clock picks.
- `evaluate_continuously(..., waiting=)` holds `waiting()` while it waits for each new
  checkpoint; `save_now()` saves the state at the current step unless the newest checkpoint
  holds it (a preempted run's last save).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import orbit
import tensorflow as tf
from absl import logging

from orbitask.trainers.actions.evaluation_points import evaluation_entry
from orbitask.trainers.actions.schedule import Periodic, Schedule
from orbitask.trainers.actions.step_rate import StepRate
from orbitask.trainers.actions.triggers import Trigger
from orbitask.trainers.distribution import cluster
from orbitask.trainers.engine.task_trainer import step_now
from orbitask.trainers.state import checkpoint_restore


class Controller(orbit.Controller):
    """`orbit.Controller` with safe restore and saves by step multiples and/or elapsed time.

    Args:
      checkpoint_interval: save at every multiple of this step, or None.
      checkpoint_seconds: save when this many seconds passed since the last save, or None.
      save_at_completion: save at the end of `train` even when neither rule above is set.
        With all three unset, saving follows Orbit (the manager's `checkpoint_interval`).
      on_loop: `on_loop(steps, seconds)` after each device loop, with the wall time of
        `trainer.train` (e.g. `LoopLength.observe`), or None.
      evaluated_step: an int64 variable in the checkpoint recording the step of the last
        evaluation of `train_and_evaluate` (module docstring), or None.
      eval_at_start: `train_and_evaluate` evaluates before training when no evaluation is
        recorded (module docstring).
      periodic: `Periodic` entries run after each device loop, first, in order (module
        docstring); Orbit's `train_actions` run after them.
      step_rate: the run's `StepRate`, whose figure the `summaries` entry writes as
        `steps_per_second` (the progress line's); None makes one.
      **kwargs: `orbit.Controller`'s arguments, all honoured.
    """

    def __init__(
        self,
        *,
        checkpoint_interval: int | None = None,
        checkpoint_seconds: float | None = None,
        save_at_completion: bool = False,
        on_loop: Callable[[int, float], None] | None = None,
        evaluated_step: tf.Variable | None = None,
        eval_at_start: bool = False,
        periodic: Sequence[Periodic] = (),
        step_rate: StepRate | None = None,
        **kwargs,
    ):
        # The `checkpoint` entry's rule. Steps agree on every worker; the clock is this worker's.
        self._saves = Trigger(
            every_steps=checkpoint_interval or None, every_secs=checkpoint_seconds or None
        )
        self._own_rule = bool(checkpoint_interval or checkpoint_seconds or save_at_completion)
        self._on_loop = on_loop
        self._loop_steps = kwargs.get("steps_per_loop")
        self._save_options = tf.train.CheckpointOptions(
            enable_async=bool(kwargs.get("enable_async_checkpointing", False))
        )
        self._saved_step: int | None = None
        self.step_rate = step_rate or StepRate()
        self._lengths: dict[int, tf.Tensor] = {}  # loop length -> its constant, made once
        self._evaluated = evaluated_step
        self._eval_at_start = eval_at_start
        self._recorded: int | None = None  # `evaluated_step` in the newest checkpoint, if known
        if evaluated_step is not None:  # first: the other eval actions may save a checkpoint
            kwargs["eval_actions"] = [self._mark_evaluated, *(kwargs.get("eval_actions") or ())]
        super().__init__(**kwargs)
        if evaluated_step is not None:
            self._recorded = int(evaluated_step.numpy())
        self._loop_end = 0  # the step the last device loop ended at, before any entry ran
        manager = getattr(self, "summary_manager", None)  # none without a trainer
        writes = getattr(manager, "entry", None)  # a `LoopSummaryManager`'s
        self.schedule = Schedule(
            [
                *periodic,
                Periodic("train_actions", self._run_train_actions),
                Periodic("summaries", self._write_summaries),
                *([writes()] if writes is not None else []),
                self._checkpoint_entry(),
            ],
            current_step=self._step_now,
            agree=cluster.agreement(self.strategy),
        )

    def train(self, steps: int, checkpoint_at_completion: bool = True) -> None:
        """Trains until the global step is `steps` (Orbit's `train`, one step read a loop), each
        device loop ending where a loop-ending entry of the schedule is due. Eager."""
        self._require("trainer", for_method="train")
        step = int(self.global_step.numpy())
        self.schedule.start(step)
        self.step_rate.start(step)  # (a progress line's start marked it first)
        while step < steps:
            length = self._loop_steps
            length = length(step) if callable(length) else length
            until = self.schedule.steps_until_due(step)
            if until is not None:
                length = min(length, until)
            step = self._train_n_steps(max(1, min(steps - step, length)), step)
        if checkpoint_at_completion:
            self._maybe_save_checkpoint(check_interval=False)
        self._sync_on_async_checkpointing()

    def train_and_evaluate(
        self,
        train_steps: int,
        eval_steps: int = -1,
        eval_interval: int | None = None,
        eval_seconds: float | None = None,
        when: Trigger | None = None,
    ) -> dict | None:
        """Trains until step `train_steps`, evaluating for `eval_steps` at each evaluation point
        (Orbit's `train_and_evaluate` with the points fixed by the step, not by the start),
        and with `eval_seconds` also after the device loop that ends that many seconds of
        training after the last evaluation (module docstring). `when`: the evaluation's
        `Trigger` whole instead (a run's, from its settings), which `eval_interval` and
        `eval_seconds` then leave alone. With `evaluated_step`, first
        evaluates an evaluation point the checkpoint did not record; with `eval_at_start`,
        first evaluates where no evaluation is recorded. Eager; returns the last evaluation's
        logs (None if none ran)."""
        self._require("trainer", for_method="train_and_evaluate")
        self._require("evaluator", for_method="train_and_evaluate")
        evaluated, outputs = self._evaluated, [None]

        def evaluate(_: dict) -> None:
            self._sync_on_async_checkpointing()  # the best export copies the newest checkpoint
            outputs.append(self.evaluate(steps=eval_steps))

        def first_evaluation(step: int, due: int) -> None:
            if evaluated is None or int(evaluated.numpy()) < 0:
                # No record (a fresh run, or a checkpoint of --mode=train): it starts here.
                if self._eval_at_start:
                    evaluate({})  # the baseline; recorded at `step`
                elif evaluated is not None:
                    evaluated.assign(step)
                return
            if due > int(evaluated.numpy()):
                logging.info("evaluation of step %d not recorded: evaluating at %d", due, step)
                evaluate({})

        when = when or Trigger(
            every_steps=eval_interval or None, every_secs=eval_seconds, at_steps=(train_steps,)
        )
        entry = evaluation_entry(evaluate, when, train_steps, at_start=first_evaluation)
        with self.schedule.including(entry):
            self.train(train_steps, checkpoint_at_completion=False)
        output = outputs[-1]
        self._maybe_save_checkpoint(check_interval=False)
        if evaluated is not None and self.checkpoint_manager is not None:
            if self._recorded != int(evaluated.numpy()):
                self._save(self._step_now())  # the last evaluation's record
        self._sync_on_async_checkpointing()
        return output

    def evaluate_continuously(
        self,
        steps: int = -1,
        timeout: float | None = None,
        timeout_fn: Callable[[], bool] | None = None,
        waiting: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> dict | None:
        """Evaluates each new checkpoint (Orbit's `evaluate_continuously`), holding `waiting()`
        while waiting for the next one (`PreemptionWatcher.waiting`: a signal stops the wait
        at once). Eager; returns the last evaluation's logs (None if none ran)."""
        self._require("evaluator", for_method="evaluate_continuously")
        self._require("checkpoint_manager", for_method="evaluate_continuously")
        found = tf.train.checkpoints_iterator(
            self.checkpoint_manager.directory, timeout=timeout, timeout_fn=timeout_fn
        )
        output = None
        while True:
            with (waiting or contextlib.nullcontext)():
                path = next(found, None)
            if path is None:
                return output
            self.restore_checkpoint(path)
            output = self.evaluate(steps)

    def save_now(self) -> str:
        """Saves a checkpoint of the current step unless the newest one holds this state (its
        step and, with `evaluated_step`, its evaluation record), and waits for the write.
        Eager; returns the checkpoint's path.

        Raises:
          NoSpaceError: from the manager, when the device is full.
        """
        manager = self.checkpoint_manager
        manager.sync()  # an async save of this step shows in `latest_checkpoint` once written
        step = self._step_now()
        latest = manager.latest_checkpoint
        recorded = self._evaluated is None or self._recorded == int(self._evaluated.numpy())
        if not (latest and latest.endswith(f"-{step}") and recorded):
            self._save(step)
            manager.sync()
        return manager.latest_checkpoint

    def _mark_evaluated(self, output: dict) -> None:
        del output
        self._evaluated.assign(int(self.global_step.numpy()))

    def _train_n_steps(self, num_steps: int, start: int | None = None) -> int:
        """Runs one device loop, then the schedule's due entries; returns the step after them.

        Orbit's `_train_n_steps` without its step reads, `StepTimer`, log formatting, a new
        constant each loop and, when no `summary_interval` is set, the summary writer around the
        loop: the trainer reports the step its loop ended at (`last_step`).
        """
        if start is None:
            start = self._step_now()
        steps = self._lengths.get(num_steps)
        if steps is None:
            steps = self._lengths[num_steps] = tf.constant(num_steps, tf.int32)
        began = time.perf_counter()
        if self.summary_interval:  # summaries written by the step itself, as Orbit records them
            record = lambda: self.global_step % self.summary_interval == 0  # noqa: E731
            with self.summary_manager.summary_writer().as_default(), tf.summary.record_if(record):
                output = self.trainer.train(steps) or {}
        else:  # Orbit would record none; and leaving `as_default` flushes the writer
            with tf.summary.record_if(False):
                output = self.trainer.train(steps) or {}
        if self._on_loop is not None:
            self._on_loop(num_steps, time.perf_counter() - began)
        end = self._loop_end = self._step_now()
        if end != start + num_steps:
            logging.warning(
                "`trainer.train(%d)` did not update `global_step` by %d: %d -> %d.",
                num_steps, num_steps, start, end,
            )  # fmt: skip
        self.schedule.run(output, start)
        return self._step_now()  # after the entries (a NaN rollback moves it)

    def _run_train_actions(self, output: dict) -> None:
        """The `train_actions` entry: Orbit's train actions, in order."""
        for action in self.train_actions:
            action(output)

    def _write_summaries(self, output: dict) -> None:
        """The `summaries` entry: the loop's logs and steps/sec (`step_rate`) to train/, and a
        log line."""
        end = self._loop_end
        rate = self.step_rate.at(end)
        if logging.level_info():
            logging.info("train | step: %6d | steps/sec: %6.1f", end, rate)
        # A new dict: an action may keep the one it received.
        self.summary_manager.write_summaries({**output, "steps_per_second": rate})
        self.summary_manager.flush()

    def _checkpoint_entry(self) -> Periodic:
        """The `checkpoint` entry: by the Controller's rules (module docstring), or after every
        loop by the manager's `checkpoint_interval` (Orbit's) when none is set."""
        if not self._own_rule:
            return Periodic("checkpoint", lambda _: self._maybe_save_checkpoint())
        save = lambda _: self._maybe_save_checkpoint(check_interval=False)  # noqa: E731
        return Periodic("checkpoint", save, when=self._saves, ends_loop=True)

    def _step_now(self) -> int:
        """The global step (`engine.task_trainer.step_now`)."""
        return step_now(self.trainer, self.global_step)

    def restore_checkpoint(self, checkpoint_path: str | None = None) -> str | None:
        """Restores `checkpoint_path`, or the newest readable checkpoint when None; with no
        checkpoint at all, runs the manager's `init_fn` (`restore_or_initialize`). Eager;
        returns the restored path or None."""
        manager = self.checkpoint_manager
        self._require("checkpoint_manager", for_method="restore_checkpoint")
        with self.strategy.scope():
            if checkpoint_path is not None:
                checkpoint_restore.restore(manager.checkpoint, checkpoint_path)
                return checkpoint_path
            if manager.latest_checkpoint is None:
                return manager.restore_or_initialize()
            path = checkpoint_restore.restore_newest_readable(manager.checkpoint, manager)
        if self._evaluated is not None:
            self._recorded = int(self._evaluated.numpy())
        if path:
            logging.info("restored from checkpoint %s", path)
            print(f"orbitask: resumed from {path} (step {int(self.global_step.numpy())})")
        return path

    def _maybe_save_checkpoint(self, check_interval: bool = True) -> bool:
        if not self._own_rule:
            return super()._maybe_save_checkpoint(check_interval)
        manager = self.checkpoint_manager
        if manager is None:
            return False
        step = self._step_now()  # when to save is the schedule's "checkpoint" entry
        latest = manager.latest_checkpoint  # (an async save shows there once written)
        if step == self._saved_step or (latest and latest.endswith(f"-{step}")):
            return False  # already saved at this step
        self._save(step)
        return True

    on_saved: Callable[[str], None] | None = None  # called with each saved checkpoint's path

    def _save(self, step: int) -> None:
        path = self.checkpoint_manager.save(
            checkpoint_number=step, check_interval=False, options=self._save_options
        )
        if self.on_saved is not None:
            self.on_saved(path)
        self._saves.fired(step)
        self._saved_step = step
        if self._evaluated is not None:
            self._recorded = int(self._evaluated.numpy())
