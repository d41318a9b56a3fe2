"""The defaults that configs/defaults.gin lists are the ones in effect, and it lists them all.

Each default has one home, the code; defaults.gin binds only what every experiment must set and
lists every other setting commented out, as a reference. These tests keep that list true.
"""

import inspect
import pathlib
import re

import gin

import orbitask
from orbitask.trainers.run import settings

DEFAULTS = pathlib.Path(__file__).resolve().parents[1] / "configs" / "defaults.gin"
LISTED = re.compile(r"^# orbitask\.(\w+)\.(\w+) = (.+?)(?:\s+#.*)?$")
BOUND = re.compile(r"^(?!#)\s*(\S+)\s*=", re.M)
CONFIGURABLES = (
    "run_experiment",
    "Task",
    "NanGuard",
    "ValidationControl",
    "learning_rate_schedule",
    "WarmStart",
    "ExponentialMovingAverage",
)
NOT_SETTINGS = {"run_experiment": {"task", "model_dir", "mode", "train_steps"}, "Task": {"name"}}


def _in_effect(owner: str) -> dict:
    """`owner`'s keyword defaults as Python calls it: its signature's."""
    target = getattr(orbitask, owner)
    target = target.__init__ if inspect.isclass(target) else target
    parameters = inspect.signature(inspect.unwrap(target)).parameters.values()
    return {
        p.name: p.default
        for p in parameters
        if p.name != "self"
        and p.default is not inspect.Parameter.empty
        and p.default is not gin.REQUIRED
        and p.name not in NOT_SETTINGS.get(owner, ())
    }


def _listed() -> dict:
    listed = {}
    for line in DEFAULTS.read_text().splitlines():
        if match := LISTED.match(line):
            owner, name, text = match.groups()
            listed.setdefault(owner, {})[name] = eval(text)  # noqa: S307 (literals of our own file)
    return listed


def test_every_listed_default_is_the_one_in_effect():
    listed = _listed()
    assert set(listed) == set(CONFIGURABLES)
    for owner, values in listed.items():
        effect = _in_effect(owner)
        wrong = {
            k: (v, effect.get(k, "<no such setting>"))
            for k, v in values.items()
            if effect.get(k, ...) != v
        }
        assert not wrong, f"{owner}: listed vs in effect {wrong}"


def test_every_setting_is_listed():
    listed = _listed()
    for owner in CONFIGURABLES:
        missing = sorted(set(_in_effect(owner)) - set(listed.get(owner, {})))
        assert not missing, f"configs/defaults.gin does not list {owner}: {missing}"


def test_defaults_gin_binds_only_what_every_experiment_must_set():
    bound = BOUND.findall(DEFAULTS.read_text())
    assert bound == [
        "TASK",
        "TRAIN_STEPS",
        "orbitask.run_experiment.task",
        "orbitask.run_experiment.train_steps",
    ]


def test_run_experiment_takes_each_default_from_the_settings_groups():
    """One home per default: a group's default changed is the run_experiment default changed."""
    effect = _in_effect("run_experiment")
    groups = settings.defaults()
    del groups["train_steps"]
    assert {k: effect[k] for k in groups} == groups
    assert set(effect) - set(groups) == {
        "eval_checkpoint",
        "fast_dev_run",
        "output_dir",
        "summary_dir",
        "params",
    }


def test_every_run_experiment_argument_reaches_its_group_by_name(monkeypatch):
    """Each argument lands in the group field of its name: a distinct value given to every one
    comes back from the settings the runner receives, and none is a group's default."""
    from orbitask.trainers.run import experiment

    received = {}

    class Capture:  # the runner's place: what run_experiment hands on
        def __init__(self, task, model_dir, mode, settings, **kwargs):
            received.update(settings=settings, mode=mode)

        def run(self):
            return {}

    monkeypatch.setattr(experiment, "ExperimentRunner", Capture)
    given = {name: f"value of {name}" for name in settings.defaults()}
    experiment.run_experiment(task=object(), model_dir="unused", mode="train", **given)
    assert received["mode"] == "train"
    assert settings.flat(received["settings"]) == given
