"""Write the README's "Where versions differ" table from compatgrad/versions.py.

    python tools/versions_table.py [--readme README.md]

One row per probe registered in ``compatgrad.versions``, in its order: what differs, which versions
have what, the probe, and the modules of compatgrad that call it (found by ``versions.<probe>(`` in
their source). With ``--readme`` the table replaces the text between the README's
``<!-- versions-table -->`` and ``<!-- /versions-table -->`` markers; otherwise it is printed.
"""

import argparse
import os
import re
import sys
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from readme_markers import replace_between_markers  # noqa: E402  (tools/ is the script's folder)

from compatgrad import versions  # noqa: E402  (the checkout's, not an installed one)

CALL = re.compile(r"\bversions\.(\w+)\(")


def callers(package: str) -> Dict[str, List[str]]:
    """Probe name -> the modules calling it (paths relative to ``package``), in path order."""
    found: Dict[str, List[str]] = {}
    for folder, _, files in sorted(os.walk(package)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.endswith(".py") or os.path.samefile(path, versions.__file__):
                continue
            with open(path) as handle:
                called = set(CALL.findall(handle.read()))
            for probe in sorted(called):
                found.setdefault(probe, []).append(os.path.relpath(path, package).replace(os.sep, "/"))
    return found


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(package: str) -> str:
    used = callers(package)
    rows = ["| what differs | versions: what they have | probe | called in |", "|---|---|---|---|"]
    for probe in versions.PROBES:
        sides = "<br>".join(f"**{cell(when)}**: {cell(what)}" for when, what in probe.sides.items())
        where = ", ".join(used.get(probe.name, [])) or "-"
        rows.append(f"| {cell(probe.differs)} | {sides} | `versions.{probe.name}` | {where} |")
    footer = f"{len(versions.PROBES)} probes; written by `python tools/versions_table.py --readme README.md`."
    return "\n".join(rows + ["", footer])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readme", help="write the table into this README between its markers")
    args = parser.parse_args(argv)
    text = table(os.path.join(ROOT, "compatgrad"))
    if args.readme:
        replace_between_markers(args.readme, "versions-table", text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
