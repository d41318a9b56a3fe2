"""SIGTERM in every mode: the run stops after the device loop or evaluation under way and exits
75 (a checkpoint of the stop step where it trains, none where it only evaluates); two more
SIGTERMs during the save and the shutdown keep exit 75. The real binary, in a subprocess."""

import itertools
import json
import os
import random
import re
import shutil
import signal
import threading
import time

import gin
import pytest
import tensorflow as tf

from orbitask.tasks.examples.digits import DigitsClassification
from tests import faults

EVAL_STEPS = 6  # the digits validation set (360 examples) in batches of 64
TIMEOUT = 120


@gin.configurable("signals_test.SlowEvalDigits")
class SlowEvalDigits(DigitsClassification):
    """Digits whose evaluation steps each append a byte to `marker` (an evaluation is under
    way, and how many steps ran); the run's first one then sleeps `first_step_seconds`, so that
    a signal sent on seeing the marker arrives during that step."""

    def __init__(self, marker: str = "", first_step_seconds: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.marker = marker
        self.first_step_seconds = first_step_seconds

    def validation_step(self, batch, model, metrics=None, *, loss_fn, lr):
        if self.marker:
            tf.py_function(self._evaluating, [], [])
        return super().validation_step(batch, model, metrics, loss_fn=loss_fn, lr=lr)

    def _evaluating(self):
        with open(self.marker, "a") as f:
            first = f.tell() == 0
            f.write(".")
        if first:
            time.sleep(self.first_step_seconds)


def command(model_dir, mode, steps=600, marker=None, sleep=0.0, interval=1000):
    """`faults.command` in `mode` with `SlowEvalDigits` (`marker`, `first_step_seconds=sleep`),
    checkpoints every `interval` steps (and SIGTERM's, and the last), evaluations at 20, 40..."""
    task = [
        "import tests.test_signals",
        "TASK = @signals_test.SlowEvalDigits()",
        f"signals_test.SlowEvalDigits.marker = '{marker or ''}'",
        f"signals_test.SlowEvalDigits.first_step_seconds = {sleep}",
        f"orbitask.run_experiment.checkpoint_interval = {interval}",
        "orbitask.run_experiment.eval_interval = 20",
    ]
    cmd = faults.command(model_dir, 1, steps, task)
    return [a for a in cmd if not a.startswith("--mode=")] + [f"--mode={mode}"]


def preempt(cmd, ready, seed):
    """Starts `cmd`, waits until `ready(output so far)`, sends SIGTERM, then two more, each
    0.05-0.5 s after the one before. Returns `(exit status, output, signals sent while the
    run was alive, seconds from the first signal to the exit)`."""
    rng = random.Random(seed)
    proc = faults.start(cmd)
    lines = []

    def read():
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + TIMEOUT
    try:
        while not ready("".join(lines)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"not ready (exit {proc.poll()}):\n{''.join(lines)[-3000:]}")
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        first, sent = time.monotonic(), 1
        for _ in range(2):
            time.sleep(rng.uniform(0.05, 0.5))
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                sent += 1
        proc.wait(timeout=TIMEOUT)
        took = time.monotonic() - first
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    return proc.returncode, "".join(lines), sent, took


def preempted_line(output: str) -> str:
    lines = [x for x in output.splitlines() if x.startswith("orbitask: preempted:")]
    assert len(lines) == 1, output[-3000:]
    return lines[0]


def exists(path) -> bool:
    return os.path.exists(path)


def checkpoints_in(model_dir) -> list[str]:
    return sorted(p.name for p in model_dir.glob("ckpt-*"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """An uninterrupted train_and_eval run to step 40 (one checkpoint, at 40)."""
    model_dir = tmp_path_factory.mktemp("signals") / "trained"
    done = faults.run(command(model_dir, "train_and_eval", steps=40), timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr[-2000:]
    return model_dir


@pytest.mark.slow
def test_train_saves_at_the_stop_step_and_repeats_keep_75(tmp_path):
    model_dir = tmp_path / "run"
    cmd = command(model_dir, "train")
    status, output, sent, _ = preempt(cmd, lambda out: "step 30: loss" in out, seed=1)
    assert (status, sent) == (75, 3), output[-3000:]
    losses = re.findall(r"^step (\d+): loss", output, re.MULTILINE)
    stopped = int(losses[-1])  # each device loop (10 steps) prints its last step's loss
    assert 30 <= stopped < 600
    # The only checkpoint (no interval saves) is SIGTERM's, at the step the run stopped.
    assert checkpoints_in(model_dir) == [f"ckpt-{stopped}.data-00000-of-00001",
                                        f"ckpt-{stopped}.index"]  # fmt: skip
    saved = f"saved checkpoint {model_dir}/ckpt-{stopped} at step {stopped};"
    assert saved in preempted_line(output)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eval", "continuous_eval"])
def test_evaluating_stops_after_the_evaluation_without_a_checkpoint(tmp_path, trained, mode):
    model_dir, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(trained, model_dir)
    before = checkpoints_in(model_dir), (model_dir / "checkpoint").read_text()
    cmd = command(model_dir, mode, marker=marker, sleep=0.2)
    status, output, sent, _ = preempt(cmd, lambda out: exists(marker), seed=2)
    assert (status, sent) == (75, 3), output[-3000:]
    assert "SIGTERM received: stopped after the evaluation at step 40" in preempted_line(output)
    assert len(marker.read_text()) == EVAL_STEPS  # the evaluation's loop ran to its end
    assert (checkpoints_in(model_dir), (model_dir / "checkpoint").read_text()) == before


@pytest.mark.slow
def test_continuous_eval_waiting_for_a_checkpoint_stops_at_once(tmp_path, trained):
    model_dir, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(trained, model_dir)
    cmd = command(model_dir, "continuous_eval", marker=marker)

    def waiting(output):  # the evaluation of step 40 started a while ago
        return exists(marker) and time.time() - os.path.getmtime(marker) > 3

    status, output, sent, took = preempt(cmd, waiting, seed=3)
    assert (status, sent) == (75, 3), output[-3000:]
    assert "SIGTERM received while waiting for a checkpoint newer than step 40" in (
        preempted_line(output)
    )
    assert took < 20  # the wait for checkpoints (until step 600) would last forever
    assert checkpoints_in(model_dir) == checkpoints_in(trained)


@pytest.mark.slow
def test_train_and_eval_saves_after_the_evaluation_and_resumes_exactly(tmp_path, trained):
    model_dir, marker = tmp_path / "run", tmp_path / "marker"
    # An interval save at 20 precedes the evaluation: SIGTERM's save must still record it.
    cmd = command(model_dir, "train_and_eval", 40, marker, sleep=0.2, interval=20)
    status, output, sent, _ = preempt(cmd, lambda out: exists(marker), seed=5)
    assert (status, sent) == (75, 3), output[-3000:]
    saved = f"{model_dir}/ckpt-20"
    assert f"SIGTERM received: saved checkpoint {saved} at step 20" in preempted_line(output)
    assert len(marker.read_text()) == EVAL_STEPS  # the evaluation at 20 ran to its end, alone
    assert tf.train.latest_checkpoint(str(model_dir)) == saved
    reader = tf.train.load_checkpoint(saved)
    (key,) = [k for k in reader.get_variable_to_dtype_map() if k.startswith("evaluated_step/")]
    assert reader.get_tensor(key) == 20  # the evaluation is recorded: not run again

    resumed_marker = tmp_path / "resumed_marker"
    resumed = faults.run(
        command(model_dir, "train_and_eval", 40, resumed_marker, interval=20), TIMEOUT
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from {saved} (step 20)" in resumed.stdout
    assert len(resumed_marker.read_text()) == EVAL_STEPS  # only the evaluation at 40
    faults.assert_identical(faults.final_state(trained), faults.final_state(model_dir))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sigterm_after_an_earlier_interval_save_saves_the_stop_step(tmp_path, monkeypatch, stop):
    """In-process: an interval save at step 5, then SIGTERM (or SIGHUP: a closed terminal)
    during step 7's loop. The newest checkpoint holds step 5, so the stop saves ckpt-7 and names
    it; the binary's status is 75 and a repeated signal is ignored. (SIGHUP's turn from a
    closed terminal, which would also silence `pytest -s` here: the slow test below.)"""
    from orbitask.trainers import run_experiment
    from orbitask.trainers.actions import preemption

    monkeypatch.setattr(preemption, "_leave_closed_terminal", lambda: None)
    from orbitask.trainers.commands.exits import EXIT_PREEMPTED, exit_status
    from orbitask.trainers.errors import Preempted
    from tests.helpers import TinyTask

    class SignalAt7(TinyTask):
        def at_step(self):
            return {7: lambda task, ctx: signal.raise_signal(stop)}

    def unhandled(signum, frame):
        raise AssertionError(f"{stop.name} reached the test's handler, not the run's")

    previous = signal.signal(stop, unhandled)
    try:
        with pytest.raises(
            Preempted, match=rf"{stop.name} received: saved checkpoint .*ckpt-7 at step 7;"
        ) as e:
            run_experiment(
                SignalAt7(), str(tmp_path), mode="train", train_steps=20, global_batch_size=8,
                steps_per_loop=1, checkpoint_interval=5, progress=False,
            )  # fmt: skip
        assert signal.getsignal(stop) == signal.SIG_IGN  # a second one changes nothing
    finally:
        signal.signal(stop, previous)
    assert exit_status(e.value) == EXIT_PREEMPTED
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-7")
    assert (
        tf.train.load_checkpoint(str(tmp_path / "ckpt-7")).get_tensor(
            "step/.ATTRIBUTES/VARIABLE_VALUE"
        )
        == 7
    )


def test_ctrl_c_in_process_saves_raises_interrupted_and_a_second_one_quits_at_once(tmp_path):
    """In-process (a notebook's interrupt): SIGINT during step 7's loop saves ckpt-7 and raises
    `Interrupted`; from the first signal on, SIGINT has its default action (a second Ctrl-C
    ends the process at once) and SIGTERM is ignored."""
    from orbitask.trainers import Interrupted, Preempted, run_experiment
    from tests.helpers import TinyTask

    seen = {}

    class CtrlCAt7(TinyTask):
        def at_step(self):
            def interrupt(task, ctx):
                signal.raise_signal(signal.SIGINT)
                seen["handlers"] = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

            return {7: interrupt}

    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(Interrupted, match=r"SIGINT received: saved checkpoint .*ckpt-7 at"):
            run_experiment(
                CtrlCAt7(), str(tmp_path), mode="train", train_steps=20, global_batch_size=8,
                steps_per_loop=1, progress=False,
            )  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    assert issubclass(Interrupted, Preempted)
    assert seen["handlers"] == (signal.SIG_DFL, signal.SIG_IGN)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-7")


def test_the_workers_signal_agreement_decodes_the_largest_code():
    """`cluster.largest_each`, the multi-worker agreement after each loop (the signals received:
    0 none, then a spent max_time, the stop signals, SIGINT last; each seconds rule's clock: 0
    or 1), sums one flag per
    code over the replicas and reads each vote's largest back, several votes in one all-reduce."""
    from orbitask.trainers.distribution import cluster

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    codes = (0, 1, 2, 3)
    assert [cluster.largest_each(strategy, [(code, 4)]) for code in codes] == [[0], [1], [2], [3]]
    votes = [(1, 2), (0, 3), (5, 6), (0, 2), (2, 3), (3, 6)]
    assert cluster.largest_each(strategy, votes) == [1, 0, 5, 0, 2, 3]
    assert cluster.largest_each(strategy, []) == []


def test_a_signal_after_a_workers_vote_stops_it_with_the_others_at_the_next_agreement():
    """With several workers the agreed code alone decides: a SIGTERM that reaches this worker
    while the workers agree on "no signal" (during the collective, or in the schedule after its
    vote) lets it go on with the others, and stops them all at the next agreement; stopping
    alone would leave the others waiting in a collective it never joins."""
    from orbitask.trainers.actions.preemption import PreemptionWatcher
    from orbitask.trainers.actions.schedule import AGREED
    from orbitask.trainers.errors import Preempted

    votes = []

    def agree(code):  # the collective: SIGTERM lands while it runs; no other worker had one
        votes.append(code)
        if len(votes) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return code

    watcher = PreemptionWatcher(lambda: 7, stopped=lambda name, step: f"{name} at step {step}")
    with watcher:
        watcher.take_back(agree=agree)
        watcher()  # the workers agreed on no signal: this one goes on too
        assert watcher.received == signal.SIGTERM
        watcher({AGREED: 0})  # the schedule's agreement, voted before the signal
        with pytest.raises(Preempted, match="SIGTERM at step 7"):
            watcher()  # its vote now says SIGTERM: every worker stops here
    assert votes == [0, watcher.codes.index(signal.SIGTERM)]


def test_the_agreed_signal_decides_where_it_differs_from_a_workers_own():
    """Every worker stops with the signal they agreed on (the largest: SIGINT last), not its
    own: a worker that got SIGTERM while another got Ctrl-C stops as interrupted (exit 130), and
    one whose own Ctrl-C came after its vote for the others' SIGTERM stops as preempted (75), as
    do the others. Both ways: the schedule's agreement after a loop, `agree` after an
    evaluation."""
    from orbitask.trainers.actions.preemption import PreemptionWatcher
    from orbitask.trainers.actions.schedule import AGREED
    from orbitask.trainers.errors import Interrupted, Preempted

    handlers = {
        sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    }
    cases = [
        (signal.SIGTERM, signal.SIGINT, Interrupted),
        (signal.SIGINT, signal.SIGTERM, Preempted),
        (None, signal.SIGTERM, Preempted),
    ]  # (this worker's own signal, the agreed one, the stop)
    try:
        for (own, agreed, stop), scheduled in itertools.product(cases, [True, False]):
            watcher = PreemptionWatcher(lambda: 7, stopped=lambda name, step: f"{name} at {step}")
            code = watcher.codes.index(agreed)
            with watcher:
                watcher.take_back(agree=lambda vote, code=code: code)  # the collective's result
                if own is not None:
                    os.kill(os.getpid(), own)
                    assert watcher.received == own
                with pytest.raises(Preempted, match=f"^{agreed.name} at 7$") as info:
                    watcher({AGREED: code} if scheduled else None)
            assert type(info.value) is stop and watcher.received == agreed, (own, scheduled)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@pytest.mark.slow
def test_a_closed_terminal_stops_saves_and_exits_75(tmp_path):
    """The binary on a terminal (a pty) that closes under it, as an ssh session that drops: its
    SIGHUP stops the run after the device loop under way, which saves and exits 75, although
    print_loss and the progress display write to that terminal (a write to it fails)."""
    import pty
    import select

    model_dir = tmp_path / "run"
    cmd = faults.command(model_dir, steps=100_000, extra=["orbitask.run_experiment.progress=True"])
    pid, terminal = pty.fork()
    if pid == 0:  # the child: the binary on the pty, its controlling terminal
        try:
            os.chdir(faults.REPO)
            os.execve(cmd[0], cmd, faults.env())
        finally:
            os._exit(127)  # never back into pytest
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:  # read what it writes, until a checkpoint exists
            if select.select([terminal], [], [], 0.5)[0]:
                os.read(terminal, 65536)
            latest = tf.train.latest_checkpoint(str(model_dir))
            if latest and int(latest.rsplit("-", 1)[1]) >= 20:
                break
        else:
            pytest.fail("no checkpoint while training on a terminal")
    finally:
        os.close(terminal)  # the terminal closes: the kernel sends SIGHUP
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
        pytest.fail("the run went on after its terminal closed")
    assert os.waitstatus_to_exitcode(status) == 75
    (entry,) = json.loads((model_dir / "run.json").read_text())
    assert entry["ended"] == "Preempted"
    assert tf.train.latest_checkpoint(str(model_dir)).endswith(f"ckpt-{entry['end_step']}")
