"""The ``compatgrad`` command line."""
import argparse
import os
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="compatgrad", description="Keras gradients that match the training step.")
    commands = parser.add_subparsers(dest="command")
    check = commands.add_parser("check", help="run the parity check on embedded models for every Keras importable here")
    check.add_argument("--only", nargs=2, metavar=("FLAVOUR", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.command != "check":
        parser.print_help()
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from . import check as parity

    if args.only:
        print(parity.run_only(*args.only))
        return 0
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # retracing notices about the oracle's own train functions
    rows = parity.check()
    print(parity.table(rows))
    failed = sum(not row.ok for row in rows)
    skipped = sum(row.difference is None for row in rows)
    print("{} passed, {} failed, {} skipped".format(len(rows) - failed - skipped, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
