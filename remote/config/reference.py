"""docs/reference.md's key tables, written from key_tables.py: the reference cannot list a key the
validator refuses, nor leave out one it accepts.

The page is prose with one generated region per section, between two comments; `fill` rewrites the
regions and leaves the prose alone:

    python -m homegpu.remote.config.reference docs/reference.md

tests/test_reference.py fails while the committed page differs from what this writes.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from homegpu.remote.config.key_tables import SECTIONS
from homegpu.remote.config.keys import REFERENCE_PAGE, Section

COMMAND = f"python -m homegpu.remote.config.reference {REFERENCE_PAGE}"
_REGION = re.compile(r"(<!-- keys of (?P<header>\S+): [^>]*-->\n).*?(<!-- end of the keys of (?P=header) -->)", re.S)


def key_table(section: Section) -> str:
    """The section's keys as a Markdown table: key, type, default, what it does, an example."""
    rows = ["| key | type | default | what it does | example |", "| --- | --- | --- | --- | --- |"]
    for key in section.keys:
        cells = (f"`{key.name}`", key.type, key.default, key.doc, f"`{key.example}`")
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def region(section: Section) -> str:
    """The section's whole generated region, its two comments included."""
    return (f"<!-- keys of {section.header}: written by `{COMMAND}` from remote/config/key_tables.py -->\n\n"
            f"{key_table(section)}\n<!-- end of the keys of {section.header} -->")  # blank lines: a table, not HTML


def fill(page: str) -> str:
    """The page with every section's region rewritten.

    Raises:
        ValueError: a section without its region in the page (or a region of no section).
    """
    by_header = {section.header: section for section in SECTIONS}
    found = [match["header"] for match in _REGION.finditer(page)]
    missing = [header for header in by_header if header not in found]
    unknown = [header for header in found if header not in by_header]
    if missing or unknown:
        raise ValueError(f"the page's key regions are {found}: missing {missing}, unknown {unknown}")
    return _REGION.sub(lambda match: region(by_header[match["header"]]), page)


def _cell(text: str) -> str:
    """Text that stays in its table cell: a pipe escaped, no line break."""
    return text.replace("|", "\\|").replace("\n", " ")


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else REFERENCE_PAGE)
    before = path.read_text(encoding="utf-8")
    after = fill(before)
    if after != before:
        path.write_text(after, encoding="utf-8")
    print(f"{path}: {'rewritten' if after != before else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
