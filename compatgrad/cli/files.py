"""Saved models and ``.npz`` data for the CLI: loaded by the Keras that can, matched to the model."""

import json
import os
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .._types import Model
from ..arguments import input_names, output_names
from ..errors import InvalidArgumentError, UnsupportedModelError
from . import first_line

# Which Keras to try first for a file written by a given Keras major version.
_BY_WRITER = {"3": ["keras3", "tf_keras", "tf.keras"], "2": ["tf_keras", "tf.keras", "keras", "keras3"]}


def load_model(path: str, flavours: Dict[str, Any], choice: Optional[str] = None) -> Any:
    """The compiled model at ``path`` (.keras, .h5, SavedModel directory), loaded by the first Keras
    here that can."""
    if not os.path.exists(path):
        raise InvalidArgumentError(
            "MODEL", "an existing .keras or .h5 file or SavedModel directory", repr(path)
        )
    writer = written_by(path)
    if choice is not None:
        if choice not in flavours:
            raise InvalidArgumentError(
                "--keras",
                f"one of the Keras flavours importable here {sorted(flavours)}",
                repr(choice),
            )
        order = [choice]
    else:
        major = writer.split(" ")[-1][:1] if writer else ""
        order = [
            name
            for name in _BY_WRITER.get(major, ["tf.keras", "tf_keras", "keras3", "keras"])
            if name in flavours
        ]
    failures = []
    for name in order:
        try:
            return flavours[name].models.load_model(path)
        except Exception as error:  # each Keras raises its own errors for files it cannot read
            failures.append(f"{name}: {first_line(error)[:200]}")
    raise UnsupportedModelError(
        "MODEL: {} cannot be loaded by the Keras here ({}){}".format(
            path, "; ".join(failures) or "none importable", "; it was written by " + writer if writer else ""
        )
    )


def written_by(path: str) -> Optional[str]:
    """ "Keras <version>" as the file records it, when it does."""
    try:
        if os.path.isdir(path):
            return "Keras 2 (SavedModel)" if os.path.exists(os.path.join(path, "keras_metadata.pb")) else None
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                return "Keras " + json.loads(archive.read("metadata.json"))["keras_version"]
        import h5py

        with h5py.File(path, "r") as h5:
            version = h5.attrs.get("keras_version")
            return (
                None
                if version is None
                else "Keras " + (version.decode() if isinstance(version, bytes) else str(version))
            )
    except Exception:  # unreadable metadata: say nothing rather than guess
        return None


def load_data(path: str, model: Model) -> Tuple[Any, Any, Any]:
    """(x, y, sample_weight) from an npz: ``x`` / ``x0``, ``x1``, ... / input names, the same for ``y``."""
    if not os.path.isfile(path):
        raise InvalidArgumentError("DATA", "an existing .npz file", repr(path))
    try:
        arrays = dict(np.load(path, allow_pickle=False))
    except Exception as error:
        raise InvalidArgumentError("DATA", "an .npz file (numpy.savez)", f"{path}: {error}") from None
    x, used_x = _pick(arrays, "x", input_names(model))
    y, used_y = _pick(arrays, "y", output_names(model))
    sample_weight = arrays.get("sample_weight")
    unknown = sorted(set(arrays) - used_x - used_y - {"sample_weight"})
    if unknown:
        raise InvalidArgumentError(
            "DATA",
            f"keys x / x0.. / {input_names(model)} and y / y0.. / {output_names(model)} (and sample_weight)",
            f"unknown keys {unknown}",
        )
    return x, y, sample_weight


def _pick(arrays: Dict[str, np.ndarray], prefix: str, names: List[str]) -> Tuple[Any, set]:
    if len(names) == 1:
        for key in (prefix, prefix + "0", names[0]):
            if key in arrays:
                return arrays[key], {key}
    else:
        for keys in ([prefix + str(i) for i in range(len(names))], names):
            if all(key in arrays for key in keys):
                return [arrays[key] for key in keys], set(keys)
    wanted = f"{prefix}" if len(names) == 1 else f"{prefix}0..{prefix}{len(names) - 1}"
    raise InvalidArgumentError(
        "DATA",
        "key {} or {} for the model's {}".format(wanted, names, "inputs" if prefix == "x" else "outputs"),
        f"keys {sorted(arrays)}",
    )
