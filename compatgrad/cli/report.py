"""``compatgrad grads``: gradients of a saved model on npz data, as a table, an npz and a bar chart."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _paths
from .._types import Model
from ..api import get_gradients
from ..detect import flavour_of
from ..errors import InvalidArgumentError
from ..sources import layer_outputs


def params_for(model: Model, kind: str, layers: Optional[Sequence[str]]) -> List[Any]:
    """weights (of ``layers``, default all), outputs (of ``layers``, default every non-input layer)
    or the inputs."""
    if kind == "inputs":
        return list(model.inputs)
    if kind == "outputs":
        names = (
            list(layers)
            if layers
            else [layer.name for layer in model.layers if type(layer).__name__ != "InputLayer"]
        )
        return layer_outputs(model, names)
    if not layers:
        return list(model.trainable_weights)
    chosen = [layer for layer in model.layers if layer.name in layers]
    unknown = sorted(set(layers) - {layer.name for layer in chosen})
    if unknown:
        raise InvalidArgumentError(
            "--layers", f"layer names among {[layer.name for layer in model.layers]}", unknown
        )
    return [w for layer in chosen for w in layer.trainable_weights]


def gradients(
    model: Model,
    x: Any,
    y: Any,
    sample_weight: Any,
    params: List[Any],
    learning_phase: int,
    batch_size: Optional[int],
) -> Dict[str, np.ndarray]:
    """``{name: gradient}``; with ``batch_size``, batch by batch with a progress bar, equal to the
    whole-data result."""
    if batch_size is None:
        return get_gradients(model, x, y, params, sample_weight, learning_phase, as_dict=True)
    if batch_size < 1:
        raise InvalidArgumentError("--batch-size", "a positive number of examples", batch_size)
    total = _examples(x)
    starts = range(0, total, batch_size)
    if all(hasattr(p, "assign") for p in params):  # variables: compatgrad's own dataset path
        batches = (
            (_rows(x, s, batch_size), _rows(y, s, batch_size), _rows(sample_weight, s, batch_size))
            if sample_weight is not None
            else (_rows(x, s, batch_size), _rows(y, s, batch_size))
            for s in starts
        )
        return get_gradients(
            model, batches, None, params, learning_phase=learning_phase, as_dict=True, steps=len(starts)
        )
    # Layer outputs and inputs have a row per example: each batch's rows, rescaled from its mean to
    # the whole data's.
    progress = _paths.load(flavour_of(model).root, "progbar").Progbar(len(starts))
    parts: Dict[str, List[np.ndarray]] = {}
    for count, start in enumerate(starts, 1):
        grads = _batch_gradients(model, (x, y, sample_weight), start, batch_size, params, learning_phase)
        scale = min(batch_size, total - start) / float(total)
        for name, g in grads.items():
            parts.setdefault(name, []).append(g * scale)
        progress.update(count)
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


def noise_scale(
    model: Model,
    x: Any,
    y: Any,
    sample_weight: Any,
    learning_phase: int,
    batch_size: int,
) -> Tuple[float, float, int]:
    """The gradient noise scale's terms (|G|^2, tr(Sigma), batches) from two batch sizes at the
    model's weights: each batch of ``batch_size`` examples (the data's last, shorter one left out) and
    all of them together, their mean (``callbacks.noise_scale_terms``). Gradients unclipped: clipping
    shrinks the small batches' more."""
    from ..callbacks import noise_scale_terms

    check_noise_scale(x, batch_size)
    count = _examples(x) // batch_size
    progress = _paths.load(flavour_of(model).root, "progbar").Progbar(count)
    sum_of_squares, sums = 0.0, None
    for index in range(count):
        start = index * batch_size
        batch = _batch_gradients(
            model, (x, y, sample_weight), start, batch_size, None, learning_phase, clip=False
        )
        grads = [np.asarray(g, np.float64) for g in batch.values()]
        sum_of_squares += sum(float(np.sum(g * g)) for g in grads)
        sums = grads if sums is None else [s + g for s, g in zip(sums, grads)]
        progress.update(index + 1)
    assert sums is not None  # two batches or more
    mean_square = sum(float(np.sum((s / count) ** 2)) for s in sums)
    norm, trace = noise_scale_terms(batch_size, batch_size * count, sum_of_squares / count, mean_square)
    return norm, trace, count


def _batch_gradients(
    model: Model,
    data: Tuple[Any, Any, Any],
    start: int,
    size: int,
    params: Optional[List[Any]],
    learning_phase: int,
    clip: bool = True,
) -> Dict[str, np.ndarray]:
    """``get_gradients`` (as a dict) on rows ``start`` to ``start + size`` of (x, y, sample_weight)."""
    x, y, sample_weight = (_rows(value, start, size) for value in data)
    return get_gradients(model, x, y, params, sample_weight, learning_phase, clip=clip, as_dict=True)


def check_noise_scale(x: Any, batch_size: int) -> None:
    """Two batches of ``batch_size`` or more in the data."""
    total = _examples(x)
    if not 1 <= batch_size <= total // 2:
        raise InvalidArgumentError(
            "--noise-scale", f"a batch size from 1 to half the data's {total} examples", batch_size
        )


def _examples(x: Any) -> int:
    return len(np.asarray(x[0] if isinstance(x, list) else x))


def _rows(value: Any, start: int, size: int) -> Any:
    """Rows ``start`` to ``start + size`` of an array, of each of a list of them, or None."""
    if value is None:
        return None
    return (
        [v[start : start + size] for v in value] if isinstance(value, list) else value[start : start + size]
    )


def table(grads: Dict[str, np.ndarray]) -> str:
    header = "{:<40} {:>16} {:>11} {:>11} {:>11} {:>7}".format(
        "name", "shape", "L2 norm", "mean |g|", "max |g|", "zeros"
    )
    lines = [header]
    for name, g in grads.items():
        g64 = np.asarray(g, np.float64)
        norm = float(np.sqrt(np.sum(g64**2)))
        mean = float(np.mean(np.abs(g64))) if g64.size else 0.0
        largest = float(np.max(np.abs(g64))) if g64.size else 0.0
        zeros = float(np.mean(g64 == 0)) if g64.size else 0.0
        shape = str(tuple(g.shape))
        lines.append(f"{name:<40} {shape:>16} {norm:>11.4e} {mean:>11.4e} {largest:>11.4e} {zeros:>6.1%}")
    return "\n".join(lines)


PLOT_SIZE = (8.0, 4.5)  # inches, at 100 dpi: 800 x 450 pixels
PLOT_DPI = 100


def plot(grads: Dict[str, np.ndarray], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidArgumentError(
            "--plot", "matplotlib installed (pip install 'compatgrad[plot]')", "no matplotlib"
        ) from None
    names = list(grads)
    norms = [max(float(np.sqrt(np.sum(np.asarray(grads[n], np.float64) ** 2))), 1e-30) for n in names]
    figure, axes = plt.subplots(figsize=PLOT_SIZE, dpi=PLOT_DPI)
    axes.bar(range(len(names)), norms, color="tab:blue")
    axes.set_yscale("log")
    axes.set_xticks(range(len(names)))
    axes.set_xticklabels(names, rotation=45, ha="right", fontsize=7)
    axes.set_ylabel("L2 norm of the gradient")
    axes.set_title("gradient norms per layer")
    figure.tight_layout()
    figure.savefig(path, dpi=PLOT_DPI)
    plt.close(figure)
