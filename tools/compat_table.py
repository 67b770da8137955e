"""Turn a tox run's JUnit results into the README's compatibility table.

    tox -m full                                  # writes .tox/results/<cell>-<mode>.xml
    python tools/compat_table.py [--results .tox/results] [--tox tox.ini] [--readme README.md]
    python tools/compat_table.py --matrix        # the cells as a GitHub Actions matrix (JSON)

One row per cell of the ``full`` label in tox.ini, in its order: TF version, Keras flavour, then per
mode "passed / failed / skipped" (errors count as failed), "n/a" with the reason where the cell has
no such mode, or "not run" where its results are missing; then the largest float32 parity difference
against ``train_on_batch``. Under the table: the date of the results and the commit they tested
(every commit seen, if cells disagree). With ``--readme`` the table replaces the text between the
README's ``<!-- compat-table -->`` and ``<!-- /compat-table -->`` markers; otherwise it is printed.
Exit 1 when any cell not allowed to fail (tox's ignore_outcome) failed or was not run.
"""

import argparse
import configparser
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, NamedTuple, Optional, Tuple

from readme_markers import replace_between_markers  # tools/ is the script's folder

MODES = ("eager", "graph")
FLAVOURS = {"tf.keras": "tf.keras", "keras": "standalone Keras", "tf_keras": "tf_keras", "keras3": "Keras"}


class Run(NamedTuple):
    """One mode of one cell: pytest's counts and what the suite recorded (tests/conftest.py)."""

    passed: int
    failed: int
    skipped: int
    seconds: float
    properties: Dict[str, str]
    timestamp: str


def read_run(path: str) -> Run:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{path}: no testsuite element")
    count = lambda name: int(suite.get(name, 0))  # noqa: E731
    failed = count("failures") + count("errors")
    skipped = count("skipped")
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    return Run(
        count("tests") - failed - skipped,
        failed,
        skipped,
        float(suite.get("time", 0)),
        properties,
        suite.get("timestamp", ""),
    )


def cells_of(tox_ini: str) -> List[str]:
    """The test cells of the ``full`` label (``pyXY-...``; ``lint`` runs no tests)."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(tox_ini)
    for line in parser.get("tox", "labels").splitlines():
        name, _, cells = line.partition("=")
        if name.strip() == "full":
            return [cell.strip() for cell in cells.split(",") if re.match(r"py\d+-", cell.strip())]
    raise ValueError(f"{tox_ini}: no 'full' label")


def allowed_to_fail(tox_ini: str) -> List[str]:
    """Factors whose cells tox.ini lets fail (``ignore_outcome = <factor>: true``)."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(tox_ini)
    value = parser.get("testenv", "ignore_outcome", fallback="")
    return re.findall(r"^\s*([\w,-]+):\s*true\s*$", value, re.MULTILINE)


def matrix(tox_ini: str) -> str:
    """One job per cell for .github/workflows/tests.yml: its tox env, its Python, whether it may fail."""
    allowed = allowed_to_fail(tox_ini)
    jobs = []
    for cell in cells_of(tox_ini):
        digits = re.match(r"py(\d)(\d+)", cell)
        if digits is None:
            raise ValueError(f"{tox_ini}: cell {cell} does not start with its Python (py37, py310, ...)")
        jobs.append(
            {
                "env": cell,
                "python": "{}.{}".format(*digits.groups()),
                "allowed_to_fail": _may_fail(cell, allowed),
            }
        )
    return json.dumps({"include": jobs})


def _may_fail(cell: str, allowed: List[str]) -> bool:
    return any(factor in cell.split("-") for factor in allowed)


def not_applicable(mode: str, other: Optional[Run]) -> str:
    """Why a cell has no run in ``mode``, from what its other mode recorded."""
    if other is None:
        return "not run"
    properties = other.properties
    if mode == "eager" and properties.get("tensorflow", "").startswith("1."):
        return "n/a (TF 1.x)"
    if mode == "graph" and properties.get("backend", "tensorflow") != "tensorflow":
        return "n/a (no TensorFlow)"
    if mode == "graph" and properties.get("flavour") == "keras3":
        return "refused (ModeError): Keras 3 has no graph mode"
    return "not run"


def mode_cell(run: Optional[Run], mode: str, other: Optional[Run]) -> str:
    if run is None:
        return not_applicable(mode, other)
    counts = f"{run.passed} / {run.failed} / {run.skipped}"
    if mode == "eager" and run.properties.get("train_step") == "False":
        refusal = f"refusal test {run.passed} passed / {run.failed} failed"
        return f"refused (UnsupportedModelError): no train_step; {refusal}"
    return counts


def table(results: str, tox_ini: str) -> Tuple[str, bool]:
    """The Markdown table and whether every cell not allowed to fail passed in each of its modes."""
    allowed = allowed_to_fail(tox_ini)
    rows = [
        "| cell | TF | Keras | eager | graph | largest parity diff | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    commits, stamps, ok = set(), [], True
    for cell in cells_of(tox_ini):
        runs = {}
        for mode in MODES:
            path = os.path.join(results, f"{cell}-{mode}.xml")
            runs[mode] = read_run(path) if os.path.exists(path) else None
        eager = mode_cell(runs["eager"], "eager", runs["graph"])
        graph = mode_cell(runs["graph"], "graph", runs["eager"])
        present = [run for run in runs.values() if run is not None]
        may_fail = _may_fail(cell, allowed)
        if not may_fail and ("not run" in (eager, graph) or any(run.failed for run in present)):
            ok = False
        commits.update(run.properties.get("commit", "unknown") for run in present)
        stamps.extend(run.timestamp[:10] for run in present if run.timestamp)
        properties = present[0].properties if present else {}
        flavour = properties.get("flavour", "?")
        keras = "{} {}".format(FLAVOURS.get(flavour, flavour), properties.get("keras", "")).strip()
        backend = properties.get("backend", "tensorflow")
        keras += "" if backend == "tensorflow" else f" on {backend}"
        differences = [
            float(run.properties["largest_parity_difference"])
            for run in present
            if run.properties.get("largest_parity_difference")
        ]
        rows.append(
            "| {}{} | {} | {} | {} | {} | {} | {:.0f} |".format(
                cell,
                " (allowed to fail)" if may_fail else "",
                properties.get("tensorflow", "?") or "none",
                keras,
                eager,
                graph,
                f"{max(differences):.1e}" if differences else "-",
                sum(run.seconds for run in present),
            )
        )
    stamps.sort()
    when = (
        "unknown" if not stamps else stamps[0] if stamps[0] == stamps[-1] else f"{stamps[0]} to {stamps[-1]}"
    )
    footer = (
        "Passed / failed / skipped tests per mode and the suite's seconds per cell, "
        "from `tox -m full` on {}, commit {}; written by `python tools/compat_table.py`."
    ).format(when, ", ".join(sorted(commits)) or "unknown")
    return "\n".join(rows + ["", footer]), ok


def main(argv: Optional[List[str]] = None) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=os.path.join(root, ".tox", "results"))
    parser.add_argument("--tox", default=os.path.join(root, "tox.ini"))
    parser.add_argument("--readme", help="write the table into this README between its markers")
    parser.add_argument(
        "--matrix", action="store_true", help="print the cells as a GitHub Actions matrix and exit"
    )
    args = parser.parse_args(argv)
    if args.matrix:
        print(matrix(args.tox))
        return 0
    text, ok = table(args.results, args.tox)
    if args.readme:
        replace_between_markers(args.readme, "compat-table", text)
    else:
        print(text)
    if not ok:
        print("some cells failed or did not run", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
