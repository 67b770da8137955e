"""Which Keras flavour a model is, told by its class's module and attributes, never by version strings."""

import re
import sys
import weakref
from typing import Any, Dict, NamedTuple, Optional

from . import versions
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
        f"got {model_cls.__module__}.{model_cls.__name__}"
    )


def model_class(model: object) -> type:
    """The ``Model`` class of the model's Keras: called with inputs and outputs, it builds a functional
    model."""
    for cls in type(model).__mro__:
        module = getattr(cls, "__module__", "") or ""
        if cls.__name__ == "Model" and (_KERAS3.match(module) or _KERAS2.match(module)):
            return cls
    raise UnsupportedModelError(f"model: no Keras Model class among the bases of {type(model).__name__}")


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
    # Without train_step (TF 1.x-2.1) only the graph engine can be matched.
    graph = v1 or standalone or not versions.has_train_step(model_cls)
    return Flavour(name, root, graph, custom_step=not graph and _overrides_train_step(model_cls, root))


def _overrides_train_step(model_cls: type, root: str) -> bool:
    """Whether the ``train_step`` the class runs is defined outside the Keras package it comes from."""
    owner = next((cls for cls in model_cls.__mro__ if "train_step" in vars(cls)), None)
    if owner is None:  # Keras 3's numpy backend trains nothing: its trainer has no step
        return False
    return not (owner.__module__ or "").startswith(root + ".")


def keras3_backend(root: str) -> Optional[str]:
    """The backend ("tensorflow", "jax", "torch", ...) of the Keras 3 package under ``root``."""
    package = sys.modules.get(root.split(".")[0])
    config = getattr(package, "config", None)
    backend = getattr(config, "backend", None)
    return backend() if callable(backend) else None


def installed_flavours() -> Dict[str, Any]:
    """The Keras flavours importable here: the name ``flavour_of`` gives their models -> their Keras module.

    It imports TensorFlow (where it is installed: Keras 3 on JAX needs none) and every Keras it finds,
    so only the command line calls it: the library tells a model's flavour from its class and never
    imports a framework itself.
    """
    import importlib

    try:
        import tensorflow as tf
    except ImportError:
        tf = None

    found: Dict[str, Any] = {}
    for name in ("tf.keras", "tf_keras", "keras"):
        if tf is None and name != "keras":
            continue
        try:
            keras = tf.keras if name == "tf.keras" else importlib.import_module(name)
            model_cls = keras.Model
        except Exception:  # absent, or an install that does not fit this TF: it raises anything
            continue
        if any(known.Model is model_cls for known in found.values()):
            continue  # keras 2.6-2.15 and Keras 3 on TF >= 2.16 are tf.keras itself
        found["keras3" if _KERAS3.match(model_cls.__module__) else name] = keras
    return found
