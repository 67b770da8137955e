"""The README's generated sections: text between ``<!-- name -->`` and ``<!-- /name -->`` markers."""


def replace_between_markers(readme: str, name: str, text: str) -> None:
    """Replace what the README holds between the markers of ``name`` by ``text``."""
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    with open(readme) as handle:
        content = handle.read()
    start, stop = content.find(begin), content.find(end)
    if start < 0 or stop < start:
        raise SystemExit(f"{readme}: no {begin} ... {end} markers")
    content = content[: start + len(begin)] + "\n" + text + "\n" + content[stop:]
    with open(readme, "w") as handle:
        handle.write(content)
