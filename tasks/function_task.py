"""`CallbackTask`: a Task made of plain functions with tf-custom-multi-gpu-training's names.

Code written for the seed ports by passing its functions in, unchanged::

    task = CallbackTask(create_dataset=create_dataset, create_model=create_model,
                        create_loss=create_loss, every_steps={100: save_images})
    # or, for a module (or dict) that defines the seed's functions at top level:
    task = CallbackTask.from_namespace(my_seed_module)

Seed callbacks (`every_steps[N]`, `at_step[N]`) are called on the host, between device loops, with
the seed's 14 positional arguments::

    fn(dev, step, update_gradients, loss, output, batch, train_model, train_loss, lr, optimizer,
       display_gradients, gradients, ckpt, manager)

`dev` is the `tf.distribute.Strategy`; `step` a scalar int64 tensor; `loss` the last step's loss
as a float32 tensor; `lr` the learning-rate variable; `train_model`, `train_loss`, `optimizer`,
`ckpt`, `manager` the built objects; `update_gradients`, `output`, `batch`, `display_gradients`,
`gradients` are the step's, per replica as `dev.run` returns them (`tasks.step_tensors`: the steps
a seed callback is due at run apart to keep them; a Task's own `train_step` that keeps none
passes None).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from orbitask.common.errors import ConfigError
from orbitask.tasks import callbacks as callbacks_lib
from orbitask.tasks import step_tensors
from orbitask.tasks.base import Task

REQUIRED = ("create_dataset", "create_model", "create_loss")
OPTIONAL = (
    "make_batches",
    "create_opt",
    "create_ckpt",
    "input_pre",
    "loss_pre",
    "grad_pre",
    "update_pre",
)


def seed_callback(fn: Callable) -> callbacks_lib.Callback:
    """Wraps a seed-style callback (14 positional arguments) as an orbitask callback."""

    def call(task: Any, ctx: callbacks_lib.CallbackContext) -> None:
        del task
        loss = ctx.logs.get("loss")
        fn(
            ctx.strategy,
            tf.constant(ctx.step, tf.int64),
            ctx.update_gradients,
            None if loss is None else tf.constant(loss, tf.float32),
            ctx.outputs,
            ctx.batch,
            ctx.model,
            ctx.loss_fn,
            ctx.lr,
            ctx.optimizer,
            ctx.display_gradients,
            ctx.gradients,
            ctx.checkpoint,
            ctx.manager,
        )

    call.__name__ = getattr(fn, "__name__", "seed_callback")
    call.seed_fn = fn
    return step_tensors.with_step_tensors(call)  # the seed passed the step's tensors


class CallbackTask(Task):
    """A Task built from seed-style functions. Missing required functions raise TypeError.

    Args:
      create_dataset: `dataset = create_dataset(per_replica_batch_size)`; required.
      create_model: `train_model = create_model()`; required.
      create_loss: `train_loss = create_loss()`; `loss = train_loss(loss_input)` is the batch SUM.
      make_batches, create_opt, create_ckpt, input_pre, loss_pre, grad_pre, update_pre: optional,
        with the seed's signatures; omitted ones use the seed's defaults.
      every_steps, at_step: `{N: fn}` tables of seed-style callbacks. `every_steps` defaults to
        the seed's `{10: print_loss}`; pass `{}` to turn it off.
      validation_dataset: optional `dataset = validation_dataset(per_replica_batch_size)` for eval.
      **task_kwargs: passed to `Task` (clip_norm, optimizer_epsilon, keras_flavour, name).
    """

    def __init__(
        self,
        create_dataset: Callable | None = None,
        create_model: Callable | None = None,
        create_loss: Callable | None = None,
        make_batches: Callable | None = None,
        create_opt: Callable | None = None,
        create_ckpt: Callable | None = None,
        input_pre: Callable | None = None,
        loss_pre: Callable | None = None,
        grad_pre: Callable | None = None,
        update_pre: Callable | None = None,
        every_steps: Mapping[int, Any] | None = None,
        at_step: Mapping[int, Any] | None = None,
        validation_dataset: Callable | None = None,
        **task_kwargs: Any,
    ):
        super().__init__(**task_kwargs)
        given = {"create_dataset": create_dataset, "create_model": create_model}
        given["create_loss"] = create_loss
        missing = [name for name in REQUIRED if given[name] is None]
        if missing:
            raise ConfigError(
                "CallbackTask is missing the required seed function(s) "
                f"{', '.join(missing)}; pass them as keyword arguments "
                "(e.g. CallbackTask(create_dataset=create_dataset, ...))."
            )
        self._fns = dict(given)
        for name, fn in (
            ("make_batches", make_batches),
            ("create_opt", create_opt),
            ("create_ckpt", create_ckpt),
            ("input_pre", input_pre),
            ("loss_pre", loss_pre),
            ("grad_pre", grad_pre),
            ("update_pre", update_pre),
            ("validation_dataset", validation_dataset),
        ):
            if fn is not None:
                if not callable(fn):
                    raise ConfigError(f"CallbackTask `{name}` must be callable; received {fn!r}.")
                self._fns[name] = fn
        if every_steps is None:
            self._every_steps = {10: callbacks_lib.print_loss}
        else:
            self._every_steps = _wrap_table(every_steps, "every_steps")
        self._at_step = _wrap_table(at_step, "at_step")

    @classmethod
    def from_namespace(cls, namespace: Any, **overrides: Any) -> CallbackTask:
        """Returns a CallbackTask of the seed's functions, by name, in a module or dict. Eager."""
        space = namespace if isinstance(namespace, Mapping) else vars(namespace)
        names = (*REQUIRED, *OPTIONAL, "every_steps", "at_step", "validation_dataset")
        kwargs = {name: space[name] for name in names if space.get(name) is not None}
        kwargs.update(overrides)
        return cls(**kwargs)

    # Builders.
    def build_inputs(self, per_replica_batch_size, input_context=None, training=True):
        del input_context
        if not training and "validation_dataset" in self._fns:
            return self._fns["validation_dataset"](per_replica_batch_size)
        return self._fns["create_dataset"](per_replica_batch_size)

    def make_batches(self, dataset, per_replica_batch_size):
        fn = self._fns.get("make_batches")
        return fn(dataset, per_replica_batch_size) if fn else dataset

    def build_model(self):
        return self._fns["create_model"]()

    def build_losses(self):
        return self._fns["create_loss"]()

    def build_optimizer(self, learning_rate):
        fn = self._fns.get("create_opt")
        return fn(learning_rate) if fn else super().build_optimizer(learning_rate)

    def build_checkpoint(self, directory, **trackables):
        fn = self._fns.get("create_ckpt")
        if fn is None:
            return super().build_checkpoint(directory, **trackables)
        ckpt, manager = fn(
            directory,
            trackables["step"],
            trackables["lr"],
            trackables["optimizer"],
            trackables["train_model"],
            trackables["train_loss"],
        )
        return ckpt, manager

    # Stages.
    def input_pre(self, batch, lr):
        fn = self._fns.get("input_pre")
        return fn(batch, lr) if fn else super().input_pre(batch, lr)

    def loss_pre(self, outputs, batch, model, lr):
        fn = self._fns.get("loss_pre")
        return fn(outputs, batch, model, lr) if fn else super().loss_pre(outputs, batch, model, lr)

    def grad_pre(self, loss, outputs, batch, model, loss_fn, lr):
        fn = self._fns.get("grad_pre")
        if fn:
            return fn(loss, outputs, batch, model, loss_fn, lr)
        return super().grad_pre(loss, outputs, batch, model, loss_fn, lr)

    def update_pre(self, gradients, loss, outputs, batch, model, loss_fn, lr, optimizer):
        fn = self._fns.get("update_pre")
        if fn:
            return fn(gradients, loss, outputs, batch, model, loss_fn, lr, optimizer)
        return super().update_pre(gradients, loss, outputs, batch, model, loss_fn, lr, optimizer)

    # Callbacks.
    def every_steps(self):
        return dict(self._every_steps)

    def at_step(self):
        return dict(self._at_step)


def _wrap_table(table: Mapping[int, Any] | None, name: str) -> dict[int, list]:
    wrapped = {}
    for step, fns in callbacks_lib.as_callback_lists(table, name).items():
        wrapped[step] = [_wrap(fn) for fn in fns]
    return wrapped


def _wrap(fn: Callable) -> Callable:
    """Seed callbacks take 14 positional arguments; orbitask callbacks take (task, ctx)."""
    if fn in (callbacks_lib.print_loss, callbacks_lib.print_step):
        return fn
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return seed_callback(fn)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) == 2:
        return fn
    return seed_callback(fn)
