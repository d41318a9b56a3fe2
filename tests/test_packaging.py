"""Installed (not editable), orbitask is one `orbitask` package: nothing lands as a top-level
`tasks` or `trainers`, gin finds `configs/defaults.gin` from any directory, and the binary trains
and exports from a user's directory that holds its own `tasks.py`."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

USER_TASKS = textwrap.dedent(
    """
    # The user's own module named `tasks`: it must not collide with orbitask.
    import gin
    import keras
    import numpy as np
    import tensorflow as tf

    from orbitask import Task


    @gin.configurable
    class UserTask(Task):
        def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
            x = np.random.RandomState(0).normal(size=(64, 4)).astype(np.float32)
            y = (x[:, 0] > 0).astype(np.int32)
            ds = tf.data.Dataset.from_tensor_slices((x, y))
            ds = ds.repeat() if training else ds
            return ds.batch(per_replica_batch_size, drop_remainder=training)

        def build_model(self):
            return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

        def build_losses(self):
            def loss_fn(loss_input):
                logits, labels = loss_input
                return tf.reduce_sum(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
                )

            return loss_fn
    """
)

USER_GIN = """\
include 'configs/defaults.gin'
import tasks

TASK = @UserTask()
TRAIN_STEPS = 4
orbitask.run_experiment.global_batch_size = 8
orbitask.run_experiment.progress = False
"""


def _run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


@pytest.mark.slow
def test_a_plain_install_trains_from_a_user_directory_with_its_own_tasks_py(tmp_path):
    wheels, site, user = tmp_path / "wheels", tmp_path / "site", tmp_path / "user"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(REPO)]
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("orbitask-*.whl")
    installed = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ]
    )
    assert installed.returncode == 0, installed.stderr
    top_level = sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info"))
    assert top_level == ["bin", "orbitask"] or top_level == ["orbitask"], top_level
    assert (site / "orbitask" / "configs" / "defaults.gin").is_file()
    assert (site / "orbitask" / "experiments" / "digits.gin").is_file()

    user.mkdir()
    (user / "tasks.py").write_text(USER_TASKS)
    (user / "user.gin").write_text(USER_GIN)
    env = {"PYTHONPATH": str(site), "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin"}
    where = _run(
        [sys.executable, "-c", "import orbitask; print(orbitask.__file__)"], cwd=user, env=env
    )
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
    trained = _run(
        [sys.executable, "-m", "orbitask.trainers.commands.train", "--gin_file=user.gin",
         f"--model_dir={tmp_path / 'run'}", "--mode=train"],
        cwd=user, env=env,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "orbitask: checkpoints in" in trained.stdout
    assert (tmp_path / "run" / "ckpt-4.index").is_file()

    # The run's operative config (with its `import tasks`) rebuilds the model for the export.
    exported = _run(
        [sys.executable, "-m", "orbitask.trainers.commands.cli", "export",
         f"--model_dir={tmp_path / 'run'}"],
        cwd=user, env=env,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "run" / "export" / "4" / "saved_model.pb").is_file()


def test_importing_orbitask_changes_nothing():
    probe = textwrap.dedent(
        """
        import os, sys
        import orbit.controller, gin
        env, stdout, log = dict(os.environ), sys.stdout, orbit.controller._log
        prefixes = list(gin.config._LOCATION_PREFIXES)
        import orbitask
        assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())
        assert sys.stdout is stdout and orbit.controller._log is log
        assert list(gin.config._LOCATION_PREFIXES) == prefixes
        print("unchanged")
        """
    )
    result = _run([sys.executable, "-c", probe], cwd=REPO)
    assert result.stdout.strip() == "unchanged", result.stderr
