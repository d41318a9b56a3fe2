"""One run per model directory on object storage: a lease (`trainers/state/lease.py`) with host,
pid and a heartbeat, on `ram://` (which, like `gs://`, has no `flock`)."""

import json
import time
import uuid

import gin
import pytest

from orbitask.common import files
from orbitask.trainers import run_experiment
from orbitask.trainers.errors import ConfigError
from orbitask.trainers.state.lease import LEASE_FILE, Lease
from orbitask.trainers.state.model_dir_lock import ModelDirLock
from tests.helpers import TinyTask


@pytest.fixture
def model_dir():
    folder = f"ram://orbitask-lease-{uuid.uuid4().hex[:8]}/run"
    files.makedirs(folder)
    return folder


def _foreign(model_dir, seconds_ago):
    lease = {"host": "other-host", "pid": 4242, "heartbeat": time.time() - seconds_ago}
    files.write_json(f"{model_dir}/{LEASE_FILE}", lease)


def test_a_run_holds_a_lease_renews_it_and_removes_it_at_its_end(model_dir):
    lock = ModelDirLock(model_dir)
    lease = Lease(model_dir, stale_minutes=0.01)  # a heartbeat every 0.15 s
    lease.take()
    first = files.read_json(f"{model_dir}/{LEASE_FILE}")
    assert first["pid"] and first["host"]
    time.sleep(0.5)
    assert files.read_json(f"{model_dir}/{LEASE_FILE}")["heartbeat"] > first["heartbeat"]
    lease.release()
    assert not files.exists(f"{model_dir}/{LEASE_FILE}")
    lock.take(True)  # the model directory's lock on object storage is the lease
    assert isinstance(lock._lock, Lease) and files.exists(f"{model_dir}/{LEASE_FILE}")
    lock.release()
    assert not files.exists(f"{model_dir}/{LEASE_FILE}")


def test_a_fresh_lease_of_another_run_is_refused_in_one_line(model_dir):
    _foreign(model_dir, seconds_ago=30)
    with pytest.raises(ConfigError) as caught:
        ModelDirLock(model_dir).take(True)
    message = str(caught.value)
    assert "\n" not in message
    assert (
        f"--model_dir '{model_dir}' is in use by another run (host other-host, pid 4242" in message
    )
    assert "orbitask.Lease.stale_minutes" in message


def test_a_stale_lease_is_taken_over_with_a_line(model_dir, capsys):
    _foreign(model_dir, seconds_ago=11 * 60)
    lock = ModelDirLock(model_dir)
    lock.take(True)
    out = capsys.readouterr().out
    assert "taking over the lease of host other-host, pid 4242, not renewed for 11.0 minutes" in out
    assert files.read_json(f"{model_dir}/{LEASE_FILE}")["host"] != "other-host"
    lock.release()


def test_staleness_is_a_setting(model_dir):
    _foreign(model_dir, seconds_ago=11 * 60)
    with gin.unlock_config():
        gin.bind_parameter("orbitask.Lease.stale_minutes", 30)
    try:
        with pytest.raises(ConfigError, match="not renewed for 30 minutes is taken over"):
            ModelDirLock(model_dir).take(True)
    finally:
        gin.clear_config()
    with pytest.raises(ConfigError, match="stale_minutes must be a positive number"):
        Lease(model_dir, stale_minutes=0)


def test_a_training_run_on_a_leased_directory_stops_before_any_work(model_dir):
    _foreign(model_dir, seconds_ago=5)
    with pytest.raises(ConfigError, match="is in use by another run"):
        run_experiment(TinyTask(), model_dir, mode="train", train_steps=2, global_batch_size=8,
                       strategy="one_device", progress=False)  # fmt: skip
    assert not files.glob(f"{model_dir}/ckpt-*")
    assert json.loads(files.read_text(f"{model_dir}/{LEASE_FILE}"))["pid"] == 4242
