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
    rows = parity.check()
    print(parity.table(rows))
    failed = [row for row in rows if not row.ok]
    print("{} passed, {} failed".format(len(rows) - len(failed), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
