"""``gradient_function``: a callable that takes what legacy ``K.function`` gradient code fed.

The removed recipe built the function once and fed it Keras 2's flat list::

    fn = K.function(model._feed_inputs + model._feed_targets + model._feed_sample_weights
                    [+ [K.learning_phase()]], grads)
    grads = fn(x_list + y_list + sample_weight_list [+ [learning_phase]])

The callable takes that list (the inputs, then the targets, then one sample weight per output; with
or without the trailing learning phase), in every flavour and mode, or ``x, y, sample_weight,
learning_phase`` as ``get_gradients`` does, and returns what ``get_gradients`` returns: each call
goes through it, so the gradients, the errors and the cached step are the same.
"""

from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from . import arguments
from ._types import Model
from .api import get_gradients
from .errors import InvalidArgumentError


class Layout(NamedTuple):
    """The flat list's parts: the names of the model's inputs and of its outputs (one target and one
    sample weight each)."""

    inputs: List[str]
    outputs: List[str]

    def describe(self) -> str:
        parts = [f"x: {name}" for name in self.inputs] + [f"y: {name}" for name in self.outputs]
        weights = [f"sample_weight: {name}" for name in self.outputs]
        return f"[{', '.join(parts)}] + optionally [{', '.join(weights)}] + optionally [learning_phase]"

    def split(self, values: Sequence[Any]) -> Dict[str, Any]:
        """``get_gradients``' x, y, sample_weight and learning_phase from the flat list."""
        values = list(values)
        inputs, outputs = len(self.inputs), len(self.outputs)
        phase = None
        # The learning phase is a scalar; a sample weight has a batch dimension (with one output,
        # inputs + 2 arrays is either: told by the last one's rank).
        if len(values) in (inputs + outputs + 1, inputs + 2 * outputs + 1) and np.ndim(values[-1]) == 0:
            phase = values.pop()
        if len(values) not in (inputs + outputs, inputs + 2 * outputs):
            raise InvalidArgumentError(
                "the flat list",
                f"{self.describe()}: {inputs + outputs} to {inputs + 2 * outputs + 1} values",
                f"{len(values)} values",
            )
        x, y, weights = values[:inputs], values[inputs : inputs + outputs], values[inputs + outputs :]
        return {
            "x": x[0] if inputs == 1 else x,
            "y": y[0] if outputs == 1 else y,
            "sample_weight": None if not weights else weights[0] if outputs == 1 else weights,
            "learning_phase": 0 if phase is None else int(phase),
        }


class GradientFunction:
    """``fn(flat_list)`` or ``fn(x, y, sample_weight=None, learning_phase=0)``: the gradients of
    ``params`` for that batch, as ``get_gradients(model, ..., **options)`` returns them."""

    def __init__(self, model: Model, params: Optional[Sequence[Any]], options: Dict[str, Any]):
        self.model = model
        self.params = None if params is None else list(params)
        self.options = options
        self._layout: Optional[Layout] = None

    @property
    def layout(self) -> Layout:
        """Read once the model is built: it gets its inputs on its first batch."""
        if self._layout is not None:
            return self._layout
        layout = Layout(arguments.input_names(self.model), arguments.output_names(self.model))
        if self.model.built:
            self._layout = layout
        return layout

    def __call__(
        self,
        x: Any,
        y: Any = None,
        sample_weight: Any = None,
        learning_phase: int = 0,
    ) -> Any:
        # The flat list has more entries than the model has inputs (a list that many is x alone).
        if y is None and sample_weight is None and isinstance(x, (list, tuple)):
            layout = self.layout
            if len(x) > len(layout.inputs):
                return get_gradients(self.model, params=self.params, **layout.split(x), **self.options)
        return get_gradients(self.model, x, y, self.params, sample_weight, learning_phase, **self.options)


def gradient_function(
    model: Model,
    params: Optional[Sequence[Any]] = None,
    *,
    class_weight: Optional[Dict[Any, float]] = None,
    clip: bool = True,
    unconnected: str = "raise",
    as_dict: bool = False,
    sparse: bool = False,
) -> GradientFunction:
    """A callable computing ``get_gradients(model, x, y, params, ...)`` with these options, fed the
    flat list legacy ``K.function`` code feeds (inputs, targets, sample weights per output, learning
    phase: the last two optional) or ``x, y, sample_weight, learning_phase``."""
    arguments.check_unconnected(unconnected)
    options = {
        "class_weight": class_weight,
        "clip": clip,
        "unconnected": unconnected,
        "as_dict": as_dict,
        "sparse": sparse,
    }
    return GradientFunction(model, params, options)
