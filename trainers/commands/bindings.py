"""Gin bindings given as plain arguments of the binary, as search services pass values.

    orbitask --gin_file=exp.gin --model_dir=d orbitask.run_experiment.learning_rate=0.01
    orbitask --gin_file=exp.gin --model_dir=d --orbitask.run_experiment.learning_rate=0.01 --LR=0.01

A bare `NAME=VALUE` (W&B sweeps' `${args_no_hyphens}`) is a binding, as is `--NAME=VALUE` whose
`NAME` is not one of the command's flags and is dotted or an upper-case macro's name (Vertex AI's
tuning service passes `--NAME=VALUE`). They are parsed after `--gin_params`, so they win.
"""

from __future__ import annotations

import re

_BARE = re.compile(r"([A-Za-z_][\w./]*)\s*=(.*)", re.S)
_FLAG = re.compile(r"--([A-Za-z_][\w./]*)=(.*)", re.S)
_MACRO = re.compile(r"[A-Z][A-Z0-9_]*")


def split(argv: list[str], known: object) -> tuple[list[str], list[str]]:
    """`(the other arguments, the bindings)` of `argv`; `known` holds the command's flag names
    (`name in known`). Eager."""
    others, found = [], []
    for arg in argv:
        bare, flag = _BARE.fullmatch(arg), _FLAG.fullmatch(arg)
        if bare and not arg.startswith("-"):
            found.append(f"{bare[1]} = {bare[2]}")
        elif flag and flag[1] not in known and ("." in flag[1] or _MACRO.fullmatch(flag[1])):
            found.append(f"{flag[1]} = {flag[2]}")
        else:
            others.append(arg)
    return others, found
