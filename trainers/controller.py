"""`Controller`: Orbit's outer loop with orbitask's checkpoint policy.

Two changes to `orbit.Controller`: it restores the newest *readable* checkpoint (a corrupt latest
one is skipped with a warning, never deleted), and it saves at exact multiples of the checkpoint
interval (Orbit's manager counts from the first save, so it would save at step 1, 1+k, ...), or
only at the end when the interval is None.
"""

from __future__ import annotations

import orbit
from absl import logging

from trainers import checkpoints


class Controller(orbit.Controller):
    """`orbit.Controller` with safe restore and saves at multiples of `checkpoint_interval`."""

    def __init__(self, *, checkpoint_interval: int | None, **kwargs):
        self._interval = checkpoint_interval
        super().__init__(**kwargs)

    def restore_checkpoint(self, checkpoint_path: str | None = None) -> str | None:
        """Restores `checkpoint_path`, or the newest readable checkpoint when None."""
        manager = self.checkpoint_manager
        with self.strategy.scope():
            if checkpoint_path is not None:
                checkpoints.restore(manager.checkpoint, checkpoint_path)
                return checkpoint_path
            path = checkpoints.restore_newest_readable(manager.checkpoint, manager)
        if path:
            logging.info("restored from checkpoint %s", path)
            print(f"orbitask: resumed from {path} (step {int(self.global_step.numpy())})")
        return path

    def _maybe_save_checkpoint(self, check_interval: bool = True) -> bool:
        manager = self.checkpoint_manager
        if manager is None:
            return False
        step = int(self.global_step.numpy())
        if check_interval and (not self._interval or step % self._interval):
            return False
        latest = manager.latest_checkpoint
        if latest and latest.endswith(f"-{step}"):
            return False  # already saved at this step
        manager.save(checkpoint_number=step, check_interval=False)
        return True
