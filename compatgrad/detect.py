"""Which Keras flavour a model is, told by its class's module and attributes, never by version strings."""
import re
import sys
import weakref
from typing import NamedTuple, Optional

from .errors import UnsupportedModelError

# Module of the Keras 2 engine's Model class: <root>.engine.training or <root>.engine.training_v1.
_KERAS2 = re.compile(r"^(?P<root>.+)\.engine\.training(?P<v1>_v1)?$")
# Module of Keras 3's Model class.
_KERAS3 = re.compile(r"^(?P<root>.+)\.models\.model$")


class Flavour(NamedTuple):
    name: str  # "keras" (standalone Keras 2), "tf.keras", "tf_keras" or "keras3"
    root: str  # the Keras package root the model's class comes from, for ``_paths.load``
    graph: bool  # built by the TF1-style graph engine (total_loss, K.function)
    # Eager models whose class overrides train_step: their own step runs (the graph engine never calls it).
    custom_step: bool = False


def flavour_of(model: object) -> Flavour:
    # Everything it depends on is a property of the class: looked up once per class.
    cls = type(model)
    flavour = _FLAVOURS.get(cls)
    if flavour is None:
        flavour = _FLAVOURS[cls] = _flavour_of_class(cls)
    return flavour


_FLAVOURS: "weakref.WeakKeyDictionary[type, Flavour]" = weakref.WeakKeyDictionary()


def _flavour_of_class(model_cls: type) -> Flavour:
    for cls in model_cls.__mro__:
        module = getattr(cls, "__module__", "") or ""
        match = _KERAS3.match(module)
        if match and cls.__name__ == "Model":
            root = match.group("root")
            return Flavour("keras3", root, graph=False, custom_step=_overrides_train_step(model_cls, root))
        match = _KERAS2.match(module)
        if match and cls.__name__ == "Model":
            return _keras2_flavour(model_cls, match.group("root"), bool(match.group("v1")))
    raise UnsupportedModelError(
        "model: expected a compiled Keras model (tf.keras, tf_keras, Keras 3 or standalone Keras 2), "
        "got {}.{}".format(model_cls.__module__, model_cls.__name__)
    )


def model_class(model: object) -> type:
    """The ``Model`` class of the model's Keras: calling it with inputs and outputs builds a functional model."""
    for cls in type(model).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if cls.__name__ == "Model" and (_KERAS3.match(module) or _KERAS2.match(module)):
            return cls
    raise UnsupportedModelError("model: no Keras Model class among the bases of {}".format(type(model).__name__))


def _keras2_flavour(model_cls: type, root: str, v1: bool) -> Flavour:
    tf = sys.modules.get("tensorflow")
    # Standalone Keras 2.2/2.3 layers are plain Python objects; every tf.keras layer is a tf.Module.
    standalone = tf is None or not issubclass(model_cls, tf.Module)
    if standalone:
        name = "keras"
    elif root.startswith("tf_keras"):
        name = "tf_keras"
    else:
        name = "tf.keras"
    # Before TF 2.2 the Model class has no train_step: only its graph engine can be matched.
    graph = v1 or standalone or not hasattr(model_cls, "train_step")
    return Flavour(name, root, graph, custom_step=not graph and _overrides_train_step(model_cls, root))


def _overrides_train_step(model_cls: type, root: str) -> bool:
    """Whether the ``train_step`` the class runs is defined outside the Keras package it comes from."""
    owner = next(cls for cls in model_cls.__mro__ if "train_step" in vars(cls))
    return not (owner.__module__ or "").startswith(root + ".")


def keras3_backend(root: str) -> Optional[str]:
    """The backend ("tensorflow", "jax", "torch", ...) of the Keras 3 package under ``root``."""
    package = sys.modules.get(root.split(".")[0])
    config = getattr(package, "config", None)
    backend = getattr(config, "backend", None)
    return backend() if callable(backend) else None
