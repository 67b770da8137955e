"""The ``compatgrad`` command line: doctor, check, grads, tensorboard. Bad input: one line on stderr, exit
code 2."""

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, cast

from ..errors import InvalidArgumentError


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="compatgrad", description="Keras gradients that match the training step."
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command")
    doctor = commands.add_parser(
        "doctor", help="what this environment has and which compatgrad backend a model would use"
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    check = commands.add_parser(
        "check", help="run the parity check on embedded models for every Keras importable here"
    )
    check.add_argument("--only", nargs=2, metavar=("FLAVOUR", "MODE"), help=argparse.SUPPRESS)
    grads = commands.add_parser("grads", help="gradients of a saved model on npz data")
    grads.add_argument("model", metavar="MODEL", help=".keras / .h5 file or SavedModel directory (compiled)")
    grads.add_argument(
        "data",
        metavar="DATA",
        help=".npz with x (or x0, x1, ... or input names), y (likewise), optional sample_weight",
    )
    grads.add_argument("--params", choices=("weights", "outputs", "inputs"), default="weights")
    grads.add_argument("--layers", nargs="+", metavar="NAME", help="only these layers (weights or outputs)")
    grads.add_argument("--learning-phase", type=int, choices=(0, 1), default=0)
    grads.add_argument(
        "--batch-size", type=int, help="go through the data in batches of this size, with a progress bar"
    )
    grads.add_argument(
        "--keras",
        choices=("tf.keras", "tf_keras", "keras3", "keras"),
        help="the Keras to load the model with",
    )
    grads.add_argument("--out", metavar="GRADS.npz", help="write the gradients, keyed by name")
    grads.add_argument(
        "--plot",
        metavar="NORMS.png",
        help="bar chart of the gradient norms (needs matplotlib: compatgrad[plot])",
    )
    grads.add_argument(
        "--noise-scale",
        type=int,
        metavar="BATCH",
        help="also the gradient noise scale B_simple, from batches of this size and the whole data",
    )
    board = commands.add_parser("tensorboard", help="a summary of the gradients a GradientLogger logged")
    board.add_argument("log_dir", metavar="LOGDIR", help="the GradientLogger's log_dir")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        commands_run = {"doctor": _doctor, "check": _check, "grads": _grads, "tensorboard": _tensorboard}
        return commands_run[args.command](args)
    except Exception as error:
        if args.debug:
            raise
        print(f"compatgrad {args.command}: error: {first_line(error)}", file=sys.stderr)
        return 2


def first_line(error: BaseException) -> str:
    """An error's message in one line (its class name where it has none)."""
    message = str(error).strip()
    return message.splitlines()[0] if message else type(error).__name__


def _doctor(args: argparse.Namespace) -> int:
    from . import doctor

    info = doctor.report()
    print(json.dumps(info, indent=2) if args.json else doctor.text(info))
    return 0


def _check(args: argparse.Namespace) -> int:
    from . import check as parity

    if args.only:
        print(parity.run_only(*args.only))
        return 0
    from ..detect import installed_flavours

    flavours = installed_flavours()
    _quiet_tensorflow()
    rows = parity.check(flavours)
    print(parity.table(rows))
    failed = sum(not row.ok for row in rows)
    skipped = sum(row.difference is None for row in rows)
    print(f"{len(rows) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


def _grads(args: argparse.Namespace) -> int:
    if args.noise_scale is not None and args.params != "weights":
        raise InvalidArgumentError("--noise-scale", "--params weights", f"--params {args.params}")
    if args.plot:  # fail before the slow part when the plot cannot be drawn
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise ImportError("--plot needs matplotlib: pip install 'compatgrad[plot]'") from None
    import numpy as np

    from ..detect import installed_flavours
    from . import files, report

    flavours = installed_flavours()
    _quiet_tensorflow()
    model = files.load_model(args.model, flavours, args.keras)
    x, y, sample_weight = files.load_data(args.data, model)
    params = report.params_for(model, args.params, args.layers)
    if args.noise_scale is not None:  # before the slow part
        report.check_noise_scale(x, args.noise_scale)
    grads = report.gradients(model, x, y, sample_weight, params, args.learning_phase, args.batch_size)
    print(report.table(grads))
    if args.noise_scale is not None:
        norm, trace, count = report.noise_scale(
            model, x, y, sample_weight, args.learning_phase, args.noise_scale
        )
        ratio = f"{trace / norm:.4g}" if norm > 0 else "undefined (the |G|^2 estimate is not above 0)"
        print(
            f"gradient noise scale B_simple {ratio} (batches of {args.noise_scale} and "
            f"their mean over {count}: |G|^2 {norm:.4g}, tr(Sigma) {trace:.4g}; unclipped)"
        )
    if args.out:
        np.savez(args.out, **cast(Dict[str, Any], grads))  # numpy's stub reads ** as allow_pickle
    if args.plot:
        report.plot(grads, args.plot)
    return 0


def _quiet_tensorflow() -> None:
    """TensorFlow's retracing notices (about the oracle's own train functions) would bury the output.
    Only where it is loaded: Keras 3 on JAX needs none."""
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        tf.get_logger().setLevel("ERROR")


def _tensorboard(args: argparse.Namespace) -> int:
    from . import gradlog

    print(gradlog.summary(gradlog.read(args.log_dir)))
    return 0
