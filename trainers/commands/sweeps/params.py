"""The `--param` flags of `orbitask sweep`: a gin binding and the space its values are drawn from.

    --param "orbitask.run_experiment.learning_rate=loguniform(1e-4, 1e-1)"
    --param "orbitask.DigitsClassification.hidden_units=choice([(64,), (128, 64)])"
    --param "orbitask.run_experiment.global_batch_size=int(32, 256, step=32)"
    --param "orbitask.DigitsClassification.l2=uniform(0.0, 0.01)"

The kinds: `uniform(low, high)` and `loguniform(low, high)` draw a float, `int(low, high)` an
integer (`step=`, `log=True` as Optuna's `suggest_int`), `choice([...])` one of its values,
each a Python literal that gin reads (numbers, strings, tuples, lists, None). A trial asks Optuna
for each and binds the value to the name; a choice is kept in the study as its text, so the study
shows `(128, 64)` as written.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any

from orbitask.trainers.errors import ConfigError

KINDS = ("uniform", "loguniform", "int", "choice")
_NAME = re.compile(r"[A-Za-z_][\w.]*(/[\w.]+)?")  # a gin binding: scope/module.name.param


@dataclasses.dataclass(frozen=True)
class Param:
    """One `--param`: the gin binding `name`, its `kind` and the kind's arguments."""

    name: str
    kind: str
    args: tuple
    options: dict

    def suggest(self, trial: Any) -> str:
        """Asks `trial` (an `optuna.Trial`) for a value; returns it as gin text. Eager."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.args))
        if self.kind == "int":
            return repr(trial.suggest_int(self.name, *self.args, **self.options))
        log = self.kind == "loguniform"
        return repr(trial.suggest_float(self.name, *self.args, log=log))


def parse(text: str) -> Param:
    """Parses one `--param "NAME=KIND(ARGS)"`.

    Raises:
      ConfigError: naming the `--param` and what is wrong with it.
    """
    name, sep, spec = (part.strip() for part in text.partition("="))
    if not sep or not _NAME.fullmatch(name):
        raise _bad(text, "expected NAME=KIND(ARGS), NAME a gin binding")
    try:
        call = ast.parse(spec, mode="eval").body
    except SyntaxError:
        call = None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
        raise _bad(text, f"expected KIND(ARGS) after '=', KIND one of {', '.join(KINDS)}")
    kind = call.func.id
    if kind not in KINDS:
        raise _bad(text, f"unknown kind {kind!r}; the kinds are {', '.join(KINDS)}")
    try:
        args = [ast.literal_eval(a) for a in call.args]
        options = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except ValueError:
        raise _bad(text, "the arguments must be Python literals") from None
    if kind == "choice":
        return Param(name, kind, _choices(text, call, options), {})
    return Param(name, kind, _bounds(text, kind, args, options), options)


def _choices(text: str, call: ast.Call, options: dict) -> tuple:
    """The values of `choice([...])` as gin text."""
    if options or len(call.args) != 1 or not isinstance(call.args[0], (ast.List, ast.Tuple)):
        raise _bad(text, "choice takes one list of values, e.g. choice([0.1, 0.5])")
    values = tuple(ast.unparse(element) for element in call.args[0].elts)
    if not values or len(set(values)) != len(values):
        raise _bad(text, "choice needs distinct values")
    return values


def _bounds(text: str, kind: str, args: list, options: dict) -> tuple:
    """`(low, high)` of a numeric kind, checked."""
    allowed = {"step", "log"} if kind == "int" else set()
    if len(args) != 2 or set(options) - allowed:
        more = " (and step=, log=)" if kind == "int" else ""
        raise _bad(text, f"{kind} takes (low, high){more}")
    low, high = args
    number = int if kind == "int" else (int, float)
    if not all(isinstance(v, number) and not isinstance(v, bool) for v in (low, high)):
        raise _bad(
            text, f"{kind}'s low and high must be {'integers' if kind == 'int' else 'numbers'}"
        )
    if not low < high:
        raise _bad(text, f"low must be less than high; received {low}, {high}")
    if kind == "loguniform" and low <= 0:
        raise _bad(text, f"loguniform needs low > 0; received {low}")
    return (low, high)


def _bad(text: str, why: str) -> ConfigError:
    return ConfigError(f'--param "{text}": {why}.')


def parse_all(texts: list[str]) -> list[Param]:
    """Parses every `--param`; a name given twice is refused.

    Raises:
      ConfigError: naming the bad `--param`.
    """
    found = [parse(text) for text in texts]
    for i, (text, param) in enumerate(zip(texts, found, strict=True)):
        if param.name in [p.name for p in found[:i]]:
            raise _bad(text, f"{param.name} is swept by another --param too")
    if not found:
        raise ConfigError('orbitask sweep needs at least one --param "NAME=KIND(ARGS)".')
    return found
