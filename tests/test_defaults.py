"""The defaults that configs/defaults.gin lists are the ones in effect, and it lists them all.

Each default has one home, the code (a run_experiment setting: its declaration in
`trainers/run/settings.py`); defaults.gin binds only what every experiment must set and lists
every other setting commented out, as a reference. These tests keep that list, run_experiment's
signature and the docs' names true to the declarations.
"""

import inspect
import pathlib
import re

import gin
import pytest

import orbitask
from orbitask.trainers.run import settings

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULTS = REPO / "configs" / "defaults.gin"
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
# run_experiment's arguments that are not settings (`trainers/run/experiment.py`).
OWN_ARGUMENTS = {
    "task",
    "model_dir",
    "mode",
    "eval_checkpoint",
    "output_dir",
    "summary_dir",
    "fast_dev_run",
    "params",
}
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


@pytest.mark.parametrize("name", list(settings.DECLARED))
def test_each_setting_agrees_with_its_declaration(name):
    """One declaration per setting (`settings.setting`): run_experiment's signature takes its
    default, configs/defaults.gin lists that default, and it has a doc line."""
    declared = settings.DECLARED[name]
    parameter = inspect.signature(orbitask.run_experiment).parameters.get(name)
    assert parameter is not None, f"run_experiment's signature lacks the setting {name}"
    assert parameter.default == declared.default, f"run_experiment's default of {name}"
    if name != "train_steps":  # bound to TRAIN_STEPS, which every experiment sets
        listed = _listed()["run_experiment"].get(name, "<not listed>")
        assert listed == declared.default, f"configs/defaults.gin lists {name} = {listed!r}"
    assert declared.metadata["doc"].strip(), f"the setting {name} has no doc line"


def test_run_experiment_takes_only_the_declared_settings_beside_its_own_arguments():
    parameters = set(inspect.signature(orbitask.run_experiment).parameters)
    assert parameters - set(settings.DECLARED) == OWN_ARGUMENTS


def test_the_docs_name_only_declared_settings():
    """docs/reference.md (and every page) names a `run_experiment.<name>` binding only for a
    declared setting or one of run_experiment's own arguments."""
    pages = [*sorted(REPO.glob("docs/*.md")), REPO / "README.md"]
    for page in pages:
        named = set(re.findall(r"run_experiment\.(\w+)", page.read_text()))
        unknown = sorted(named - set(settings.DECLARED) - OWN_ARGUMENTS)
        assert not unknown, f"{page.relative_to(REPO)} names no such setting: {unknown}"
    assert REPO / "docs" / "reference.md" in pages


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
    given = {name: f"value of {name}" for name in settings.DECLARED}
    experiment.run_experiment(task=object(), model_dir="unused", mode="train", **given)
    assert received["mode"] == "train"
    assert settings.flat(received["settings"]) == given
