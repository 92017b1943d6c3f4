"""GsSketch's state under TensorFlow, held in ``tf.Variable``s, and its checkpoint forms.

Horovod traces its step once, inside a ``tf.function``: the traced step reads and assigns the
variables it captured, so they are made once (under ``tf.init_scope``) and then only assigned
to, never replaced (unlike :class:`~gs_horovod.engine.state.EngineState`'s buffers).

- :class:`VariableState`, per variable path: residual (d,) f32 and momentum (d,) f32 (None
  when m = 0).
- :class:`StepState`, per optimizer (a digest of its variable paths): steps (int64), whether
  the options were compared (bool), the step's flat update (D + dense,) f32.
- :class:`Variables`: both dicts (the compressor's own, which ``tf.Module`` tracks, so that
  ``tf.train.Checkpoint(compression=gs)`` saves them under ``states`` and ``steps``), the
  saved state of those not made yet, and the forms ``local_state_dict()`` and Horovod
  elastic exchange (numpy arrays). A saved residual of another size raises ValueError
  (:func:`~gs_horovod.engine.state.check_restored`). Everything here runs eagerly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from .engine.state import check_restored


class StepState(tf.Module):
    """Per optimizer: steps applied, options compared, the flat update (D + dense,) f32."""

    def __init__(self, total: int, name: str) -> None:
        super().__init__(name=name)
        self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        self.checked = tf.Variable(False, trainable=False, name="checked")
        self.update = tf.Variable(tf.zeros([total]), trainable=False, name="update")


class VariableState(tf.Module):
    """Residual (d,) f32 and momentum (d,) f32 (when m > 0) of one variable."""

    def __init__(self, d: int, momentum: bool, name: str) -> None:
        super().__init__(name=re.sub(r"\W", "_", name))
        self.residual = tf.Variable(tf.zeros([d], tf.float32), trainable=False, name="residual")
        self.momentum = tf.Variable(tf.zeros([d], tf.float32), trainable=False, name="momentum") if momentum else None

    def load(self, path: str, residual: np.ndarray, momentum: Optional[np.ndarray]) -> None:
        """Assigns saved state of ``path`` (its size checked; momentum None: left as it is)."""
        check_restored(path, residual.size, self.residual.shape.num_elements())
        self.residual.assign(residual)
        if self.momentum is not None and momentum is not None:
            self.momentum.assign(momentum)


@dataclass
class Restored:
    """Saved state of variables and optimizers not made yet: per variable path (residual,
    momentum or None) as (d,) float32 arrays, per step key the steps."""

    states: dict[str, tuple[np.ndarray, Optional[np.ndarray]]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)


class Variables:
    """Every :class:`VariableState` (``states``, by variable path) and :class:`StepState`
    (``steps``, by step key) of one compressor, and ``restored``: what was loaded for those
    not made yet, handed over when they are. ``momentum``: whether variables keep one. A plain
    object: the dicts are the compressor's, tracked there."""

    def __init__(self, states: dict[str, VariableState], steps: dict[str, StepState], momentum: bool) -> None:
        self.states, self.steps, self.momentum = states, steps, momentum
        self.restored = Restored()

    def variable(self, path: str, d: int) -> VariableState:
        """The state of ``path`` (d elements), made at its first step (with its restored state)."""
        st = self.states.get(path)
        if st is None:
            with tf.init_scope():
                st = self.states[path] = VariableState(d, self.momentum, path)
                saved = self.restored.states.pop(path, None)
                if saved is not None:
                    st.load(path, *saved)
        return st

    def step(self, key: str, total: int) -> StepState:
        """The state of the optimizer ``key`` (a flat update of ``total``), made at its first step."""
        step = self.steps.get(key)
        if step is None:
            with tf.init_scope():
                step = self.steps[key] = StepState(total, "step_" + key)
                if key in self.restored.steps:
                    step.steps.assign(self.restored.steps.pop(key))
        return step

    def local(self) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
        """({path: {"residual", "momentum"}} as arrays (momentum None when m = 0), {key: steps}),
        restored state not made yet included."""
        variables = {path: {"residual": r, "momentum": m} for path, (r, m) in self.restored.states.items()}
        for path, st in self.states.items():
            variables[path] = {"residual": st.residual.numpy(),
                               "momentum": None if st.momentum is None else st.momentum.numpy()}
        steps = {**self.restored.steps, **{key: int(st.steps.numpy()) for key, st in self.steps.items()}}
        return variables, steps

    def zero(self) -> None:
        """Every residual, momentum and step count to zero."""
        for st in self.states.values():
            st.residual.assign(tf.zeros_like(st.residual))
            if st.momentum is not None:
                st.momentum.assign(tf.zeros_like(st.momentum))
        for step in self.steps.values():
            step.steps.assign(0)

    def uncheck(self) -> None:
        """Options compared again at every optimizer's next step."""
        for step in self.steps.values():
            step.checked.assign(False)

    def clear(self) -> None:
        """Restored state not made yet dropped, the rest zero (:meth:`zero`), options compared
        again (:meth:`uncheck`): the variables stay, as the traced steps hold them."""
        self.restored = Restored()
        self.zero()
        self.uncheck()

    def load(self, variables: dict[str, dict[str, Any]], steps: dict[str, int]) -> None:
        """Takes :meth:`local`'s forms (arrays of any shape and float dtype): assigned where
        made, kept for the others (what was kept before is dropped)."""
        pending = Restored()
        for path, saved in variables.items():
            residual = np.asarray(saved["residual"], np.float32).reshape(-1)
            momentum = None if saved["momentum"] is None else np.asarray(saved["momentum"], np.float32).reshape(-1)
            if path in self.states:
                self.states[path].load(path, residual, momentum)
            else:
                pending.states[path] = (residual, momentum)
        for key, count in steps.items():
            if key in self.steps:
                self.steps[key].steps.assign(int(count))
            else:
                pending.steps[key] = int(count)
        self.restored = pending

    @staticmethod
    def layout(variables: dict[str, dict[str, Any]], steps: dict[str, int]) -> dict[str, Any]:
        """What a joining rank needs of :meth:`local`'s forms: {"variables": {path: (d, has
        momentum)}, "steps": {key: steps}}."""
        return {"variables": {path: (np.size(v["residual"]), v["momentum"] is not None)
                              for path, v in variables.items()}, "steps": dict(steps)}

    def rejoin(self, layout: dict[str, Any]) -> None:
        """After a reset, with rank 0's :meth:`layout`: its step counts, and zeros for every
        variable this rank holds no state of."""
        for path, (d, momentum) in layout.get("variables", {}).items():
            if path not in self.states and path not in self.restored.states:
                self.restored.states[path] = (np.zeros(d, np.float32), np.zeros(d, np.float32) if momentum else None)
        for key, steps in layout.get("steps", {}).items():
            if key in self.steps:
                self.steps[key].steps.assign(steps)
            else:
                self.restored.steps[key] = steps
