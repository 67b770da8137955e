"""``compatgrad tensorboard LOGDIR``: a short summary of the gradients a ``GradientLogger`` wrote."""

import os
from typing import Dict, List, Tuple

Series = Dict[str, List[Tuple[int, float]]]  # tag -> (step, value), in step order


def read(log_dir: str) -> Series:
    """Every scalar of the event files under ``log_dir`` (TensorFlow's own reader)."""
    import tensorflow as tf

    series: Series = {}
    files = sorted(
        os.path.join(folder, name)
        for folder, _, names in os.walk(log_dir)
        for name in names
        if ".tfevents." in name
    )
    if not files:
        raise FileNotFoundError(f"LOGDIR: no TensorBoard event files under {log_dir}")
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.WhichOneof("value") == "simple_value":
                    series.setdefault(value.tag, []).append((event.step, value.simple_value))
    for points in series.values():
        points.sort()
    return series


def summary(series: Series) -> str:
    """The global norm's course, each layer's last norm, the largest update ratios, the noise scale."""
    norms = series.get("gradients/global_norm")
    if not norms:
        raise ValueError("LOGDIR: no gradients/global_norm: not a GradientLogger run")
    values = [v for _, v in norms]
    lines = [
        f"steps {norms[0][0]}-{norms[-1][0]} ({len(norms)} logged)",
        f"global norm: first {values[0]:.4g}, last {values[-1]:.4g}, min {min(values):.4g}, "
        f"max {max(values):.4g}",
    ]
    layers = _last(series, "layer_gradient_norms/")
    if layers:
        lines.append("layer norms, last: " + ", ".join(f"{name} {v:.4g}" for name, v in layers))
    ratios = sorted(_last(series, "update_ratios/"), key=lambda item: -item[1])[:5]
    if ratios:
        lines.append("largest update ratios, last: " + ", ".join(f"{name} {v:.3g}" for name, v in ratios))
    noise = series.get("gradients/noise_scale")
    if noise:
        lines.append(f"noise scale (B_simple): last {noise[-1][1]:.4g} at step {noise[-1][0]}")
    return "\n".join(lines)


def _last(series: Series, prefix: str) -> List[Tuple[str, float]]:
    return [
        (tag[len(prefix) :], points[-1][1])
        for tag, points in sorted(series.items())
        if tag.startswith(prefix)
    ]
