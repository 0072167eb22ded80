"""The outputs a real Slurm printed, recorded into tests/fixtures/slurm/ (each file's header names its command,
Slurm's version and the exit status; below it, the output verbatim)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm"


@dataclass(frozen=True)
class Recorded:
    command: str
    exit_status: int
    output: str  # stdout then stderr


def recorded(name: str) -> Recorded:
    """tests/fixtures/slurm/NAME.txt: its header read, its output as Slurm printed it."""
    text = (FIXTURES / f"{name}.txt").read_text(encoding="utf-8")
    header, output = text.split("verbatim\n", 1)
    command = re.search(r"^# command: (.*)$", header, re.M)
    status = re.search(r"^# exit status: (\d+)", header, re.M)
    assert command and status and "recorded from a real Slurm: slurm-wlm 22.05.8" in header, name
    return Recorded(command[1], int(status[1]), output)


def sections(name: str) -> dict[str, str]:
    """A fixture written in `==> PART <==` sections (batch_submission.txt): each part's text."""
    text = (FIXTURES / f"{name}.txt").read_text(encoding="utf-8")
    parts = re.split(r"^==> (.+) <==\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))
