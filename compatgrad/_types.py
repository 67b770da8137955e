"""Names for what compatgrad's signatures take, so that they say it.

TensorFlow and Keras ship no type hints, and the same role is played by different classes in each
version (a ``tf.Variable``, a Keras 3 ``Variable``, a TF 1.x ``RefVariable``): every alias is ``Any``
to mypy, and documentation to a reader.
"""

from typing import Any, Callable

Model = Any  # a Keras model: tf.keras, tf_keras, standalone Keras 2.2-2.3 or Keras 3
ModelRef = Callable[[], Model]  # a weak reference to a model (cached steps must not keep it alive)
Variable = Any  # a variable of the model or its optimizer
Tensor = Any  # a TensorFlow tensor: eager, symbolic in a graph, or traced in a tf.function
