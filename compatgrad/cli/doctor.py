"""``compatgrad doctor``: what this environment has, which backend a new model would get, known problems."""

import importlib
import platform
import sys
from typing import Any, Dict, List

from .. import versions
from ..detect import installed_flavours

# Keras 3's backends and the compatgrad backend their models get.
KERAS3_BACKENDS = {"tensorflow": "keras3", "jax": "keras3_jax", "torch": "keras3_torch"}


def report() -> Dict[str, Any]:
    flavours = installed_flavours()  # imports TensorFlow where it is installed
    tf = sys.modules.get("tensorflow")
    eager = tf is None or tf.executing_eagerly()
    found: Dict[str, Any] = {}
    problems: List[str] = []  # this combination will not work as it is
    notes: List[str] = []  # it works, with a caveat
    for name, keras in flavours.items():
        entry: Dict[str, Any] = {"version": _version(keras), "module": keras.Model.__module__}
        if name == "keras3":
            backend = keras.config.backend()
            entry["backend"] = backend
            entry["compatgrad backend"] = KERAS3_BACKENDS.get(
                backend, "none (TensorFlow, JAX or PyTorch only)"
            )
            if backend not in KERAS3_BACKENDS:
                problems.append(
                    f"Keras 3 runs on the {backend!r} backend; compatgrad needs KERAS_BACKEND "
                    "tensorflow, jax or torch"
                )
        elif name == "keras":
            entry["compatgrad backend"] = (
                "graph" if not eager else "none (standalone Keras: TF 1.x graph mode only)"
            )
            if versions.updates_race_gradients(keras):
                notes.append(
                    "standalone Keras {}: train_on_batch orders its weight updates after the loss only, "
                    "not after the gradients that read those weights, so it applies a gradient that varies "
                    "from run to run; compatgrad returns the gradient at the current weights "
                    "(Keras 2.3 does not race)".format(entry["version"])
                )
        else:
            has_train_step = versions.has_train_step(keras.Model)
            entry["compatgrad backend"] = "keras2" if eager and has_train_step else "graph"
            if eager and not has_train_step:
                problems.append(
                    f"{name} has no train_step (TF < 2.2): only graph mode is supported; call "
                    "tf.compat.v1.disable_eager_execution() before building models"
                )
            if versions.legacy_optimizers(keras) is not None:
                notes.append(
                    f"{name}: graph mode needs the legacy optimizers (keras.optimizers.legacy.*); "
                    "the default ones have no get_updates"
                )
        found[name] = entry
    tf_keras = found.get("tf_keras")
    if tf_keras and tf is not None and not _same_minor(tf_keras["version"], tf.__version__):
        problems.append(
            "tf_keras {} is installed against TensorFlow {}: install tf-keras=={}.*".format(
                tf_keras["version"], tf.__version__, ".".join(tf.__version__.split(".")[:2])
            )
        )
    if not flavours:
        problems.append(
            "no Keras importable here" if tf is None else "no Keras importable with this TensorFlow"
        )
    devices = _devices(tf) if tf is not None else _keras3_devices(found.get("keras3", {}).get("backend"))
    return {
        "python": platform.python_version(),
        "tensorflow": None if tf is None else tf.__version__,
        "default mode": "eager" if eager else "graph",
        "devices": devices,
        "keras": found,
        "problems": problems,
        "notes": notes,
    }


def text(info: Dict[str, Any]) -> str:
    lines = [
        "python      {}".format(info["python"]),
        "tensorflow  {}".format(
            "not installed"
            if info["tensorflow"] is None
            else "{} ({} by default)".format(info["tensorflow"], info["default mode"])
        ),
        "devices     {}".format(", ".join(info["devices"]) or "none"),
    ]
    for name, entry in info["keras"].items():
        extra = " on {}".format(entry["backend"]) if "backend" in entry else ""
        lines.append(
            "{:<11} {}{} -> compatgrad backend: {}".format(
                name, entry["version"], extra, entry["compatgrad backend"]
            )
        )
    lines += ["problem: " + problem for problem in info["problems"]] or ["no known problem"]
    lines += ["note: " + note for note in info["notes"]]
    return "\n".join(lines)


def _version(keras: Any) -> str:
    version = getattr(keras, "__version__", None)
    if version:
        return str(version)
    package = keras.Model.__module__.split(".")[0]
    if package == "tensorflow":  # tf.keras before 2.6 ships inside TensorFlow
        return "tf.keras of TensorFlow " + importlib.import_module("tensorflow").__version__
    try:
        from importlib import metadata

        return metadata.version(package.replace("_", "-"))
    except Exception:  # importlib.metadata is 3.8+, and a source checkout has no metadata
        return getattr(sys.modules.get(package), "__version__", "unknown")


def _same_minor(a: str, b: str) -> bool:
    return a.split(".")[:2] == b.split(".")[:2]


def _devices(tf: Any) -> List[str]:
    return [f"{device.name} ({device.device_type})" for device in versions.physical_devices(tf)]


def _keras3_devices(backend: Any) -> List[str]:
    """The devices of the framework Keras 3 runs on (without TensorFlow, nothing else tells of devices)."""
    if backend == "jax":
        jax = importlib.import_module("jax")
        return [f"{device} ({device.platform})" for device in jax.devices()]
    if backend == "torch":
        torch = importlib.import_module("torch")
        gpus = [f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())]
        return ["cpu (cpu)"] + gpus
    return []
