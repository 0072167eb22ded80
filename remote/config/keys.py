"""A section of cluster.toml as a table of its keys: what the validator accepts and what the reference says.

Each section module refuses a key its Section does not list (`Section.names`), and reference.py writes
docs/reference.md from the same Sections, so a key cannot be accepted without being documented, nor
documented without being accepted. key_tables.py holds the four tables.
"""

from __future__ import annotations

from dataclasses import dataclass

REFERENCE_PAGE = "docs/reference.md"  # where an unknown key's message sends the reader


@dataclass(frozen=True)
class Key:
    """One key of a section, as the reference shows it (Markdown in each text)."""

    name: str
    type: str  # what it takes: "string", "seconds, 0.1–3600", ...
    default: str  # what it is when left out: "`22`", "required", "none"
    doc: str  # what it does
    example: str  # one TOML line that validates, in a table that is otherwise minimal


@dataclass(frozen=True)
class Section:
    """A table of cluster.toml (`[cluster]`, `[[nodes]]`, ...) and every key it accepts, in reference order."""

    header: str
    keys: tuple[Key, ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(key.name for key in self.keys)

    @property
    def hint(self) -> str:
        """What an unknown key's message says to read."""
        return f"see the {self.header} reference in {REFERENCE_PAGE}"
