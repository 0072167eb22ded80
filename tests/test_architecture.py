"""ARCHITECTURE.md cannot drift from the code: its rooms are the import-linter layers in their order, each
room's line is the first paragraph of that room's own docstring, and each room's row names every module in it."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| (\d+) \| `([^`]+)` \| (.*?) \| (.*) \|$", re.M)


def rows(section: str) -> list[tuple[str, str, str]]:
    """(room, what lives there, modules) of each row of the table under `section`'s heading, in order."""
    text = (REPO / "ARCHITECTURE.md").read_text(encoding="utf-8")
    start = text.index(section)
    table = text[start:text.index("\n\n", text.index("| order |", start))]
    return [(room.rstrip("/").removesuffix(".py"), what, modules) for _, room, what, modules in ROW.findall(table)]


def layers(container: str) -> list[str]:
    """The container's rooms from its import-linter layers contract, highest first ("a | b" as a then b)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["type"] == "layers" and c["containers"] == [container])
    return [room.strip() for layer in contract["layers"] for room in layer.split("|")]


def summary(path: Path) -> str:
    """A docstring's first paragraph on one line, without its `homegpu.remote.NAME: ` label."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(docstring.split("\n\n")[0].split())
    return re.sub(r"^homegpu\.[a-z_.]+: ", "", first)


def source_of(top: Path, room: str) -> Path:
    folder = top / room
    return folder / "__init__.py" if folder.is_dir() else top / f"{room}.py"


def modules_of(top: Path, room: str) -> list[str]:
    folder = top / room
    # rglob: node_side/'s modules are in folders of their own (agent/, scripts/), and its row names them too
    return sorted(p.stem for p in folder.rglob("*.py") if p.stem != "__init__") if folder.is_dir() else []


def check_rooms(section: str, top: Path, expected_order: list[str]) -> None:
    found = rows(section)
    assert [room for room, _, _ in found] == expected_order, "ARCHITECTURE.md's rooms are not the layers' order"
    for room, what, modules in found:
        assert what == summary(source_of(top, room)), (
            f"ARCHITECTURE.md's line for {room} is not the first paragraph of {source_of(top, room).relative_to(REPO)}'s "
            "docstring: copy it over")
        named = set(re.findall(r"`([a-z_]+)`", modules))
        missing = [module for module in modules_of(top, room) if module not in named]
        assert not missing, f"ARCHITECTURE.md's row for {room} does not name {missing}: say what each holds"


def test_remotes_folders_are_listed_lowest_first_with_their_own_lines():
    check_rooms("`remote/` (`homegpu.remote`)", REPO / "remote", list(reversed(layers("homegpu.remote"))))


def test_tuis_rooms_are_listed_in_order_with_their_own_lines():
    check_rooms("`tui/` (`homegpu.tui`)", REPO / "tui", layers("homegpu.tui"))
