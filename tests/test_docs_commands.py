"""docs/commands.md names every option of every command: a newcomer reading the table learns what `--help`
would tell, and a new option cannot be added without its row saying so."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from homegpu.tui.cli.main import build_parser

COMMANDS_MD = Path(__file__).resolve().parent.parent / "docs" / "commands.md"
EVERY_COMMAND = ("--help", "--config", "--local")  # said once, under the table ("Global options")


def rows_of(command: str, text: str) -> list[str]:
    """The table cells that show `homegpu COMMAND ...` as their usage."""
    usages = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| `homegpu")]
    return [usage for usage in usages if re.search(rf"`homegpu {re.escape(command)}\b", usage)]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_has_a_row_naming_each_of_its_options():
    text = COMMANDS_MD.read_text(encoding="utf-8")
    missing = []
    for name, parser in subcommands().items():
        usages = rows_of(name, text)
        if not usages:
            missing.append(f"{name} (no row)")
            continue
        options = {o for action in parser._actions for o in action.option_strings if o.startswith("--")}
        missing += [f"{name} {option}" for option in sorted(options - set(EVERY_COMMAND))
                    if not any(re.search(rf"{re.escape(option)}\b", usage) for usage in usages)]
    assert not missing, f"docs/commands.md lacks: {', '.join(missing)}"


def test_a_missing_option_is_found():
    text = "| `homegpu logs JOB [--node N]` | the logs |\n| `homegpu wake NODE…` / `homegpu sleep NODE…` | wol |\n"
    assert rows_of("logs", text) == ["| `homegpu logs JOB [--node N]`"]
    assert rows_of("sleep", text) == ["| `homegpu wake NODE…` / `homegpu sleep NODE…`"]
    assert not any("--follow" in usage for usage in rows_of("logs", text))
