"""Nothing a node says takes over the user's terminal: hostile names through every command and the TUI.

The nodes here say what a shared lab box can: node3's GPU and a process on it have names that carry
terminal escapes (a replayed nvidia-smi prints them, as a driver or another user's process would),
node1 holds a worker state file whose job, run and label are escapes, and the job's `python` is a
program that prints escapes to stderr and fails. Each sequence would change the terminal's title
(OSC 0), write its clipboard (OSC 52), clear the screen (CSI 2J, and CSI as the C1 control \\x9b),
and one name is Rich markup. Every command must show them as visible text (`\\x1b]0;...`), never send
them; `status --json` must keep them exact (JSON escapes them). The TUI runs in tmux with
`set-clipboard on`, where an OSC 52 would make a paste buffer and an OSC 0 would retitle the pane.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_replay import FIXTURES, nvidia_smi_in
from helpers import homegpu, homegpu_argv, wait_for
from simcluster import SimCluster, free_job_port
from test_tui_tmux import SESSION, terminal_factory  # noqa: F401  (a fixture)


TITLE = "\x1b]0;pwned-title\x07"
CLIPBOARD = "\x1b]52;c;cHduZWQ=\x07"  # "pwned"
CLEAR = "\x1b[2J"
C1_CSI = "\x9b31m"
MARKUP = "[bold red]x[/]"
GPU_NAME = f"{TITLE}{CLIPBOARD}{CLEAR}{C1_CSI}{MARKUP} H100"
PROCESS_NAME = f"{TITLE}{CLIPBOARD}python3"
STATE = {"job": f"{TITLE}job", "run_id": f"{CLEAR}run", "label": f"{C1_CSI}label{CLIPBOARD}", "index": 0,
         "generation": 1, "pid": 0, "start_time": 0}
STDERR = f"{TITLE}{CLIPBOARD}{CLEAR}no python here"
GPU_SHOWN = "\\x1b]0;pwned-title\\x07\\x1b]52;c;cHduZWQ=\\x07\\x1b[2J\\x9b31m[bold red]x[/] H100"

RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # every control but newline and tab
SHOWN = "\\x1b]"  # how an escape reads once made visible


def assert_shown(output: str, what: str) -> None:
    """`output` carries the hostile text as visible characters, and no control character."""
    assert not RAW.search(output), f"{what} printed a control character: {output!r}"
    assert SHOWN in output, f"{what} did not show the hostile text: {output!r}"


def assert_untouched(term) -> None:
    """The terminal (tmux, with set-clipboard on) kept its clipboard and the pane its title."""
    assert term._run("list-buffers") == "", "a node wrote the clipboard (OSC 52 made a tmux paste buffer)"
    title = term._run("display-message", "-p", "-t", SESSION, "#{pane_title}").strip()
    assert title == "before", f"a node retitled the terminal: {title!r}"


@pytest.fixture
def hostile_cluster(sim_cluster: SimCluster, tmp_path: Path) -> Iterator[Path]:
    """cluster.toml for the three nodes, with a job "evil" on node2 and node3 whose python fails
    saying escapes; node3's GPU and its process have hostile names, node1 a hostile state file."""
    gpus, apps = tmp_path / "gpus.csv", tmp_path / "apps.csv"
    recorded = (FIXTURES / "h100-80gb-hbm3" / "gpus_load.csv").read_text().split(", ")
    gpus.write_text(", ".join([recorded[0], GPU_NAME, *recorded[2:]]))
    uuid = recorded[2]
    apps.write_text(f"{uuid}, {os.getpid()}, {PROCESS_NAME}, 20076\n")
    python = tmp_path / "evil-python"
    python.write_text(f"#!/bin/sh\nprintf '%s\\n' '{STDERR}' >&2\nexit 1\n")
    python.chmod(0o755)
    run_dir = sim_cluster.node("node1").work_dir / "runs" / "hostile-run"
    run_dir.mkdir(parents=True)
    (run_dir / f"{STATE['label']}.json").write_text(json.dumps(STATE))  # the file's name is the worker's label
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={"evil": {
        "python": str(python), "nodes": ["node2", "node3"], "port": free_job_port(), "max_restarts": 0}})
    try:
        with nvidia_smi_in(sim_cluster.node("node3").extra_path, gpus, apps,
                           version_fixture=FIXTURES / "h100-80gb-hbm3" / "smi_version.txt"):
            yield config
    finally:
        shutil.rmtree(run_dir)


def test_every_command_shows_what_a_node_says_and_never_sends_it(hostile_cluster: Path, tmp_path: Path):
    config = ("--config", str(hostile_cluster))
    status = homegpu(*config, "status")
    assert_shown(status.stdout + status.stderr, "status")
    assert "\\x1b]0;pwned-title\\x07" in status.stdout

    exact = homegpu(*config, "status", "--json")
    assert not RAW.search(exact.stdout), exact.stdout  # JSON escapes them ...
    [node3] = [node for node in json.loads(exact.stdout)["nodes"] if node["name"] == "node3"]
    gpu = node3["stats"]["gpus"][0]
    assert gpu["name"] == GPU_NAME and gpu["processes"][0]["name"] == PROCESS_NAME  # ... and keeps them exact

    jobs = homegpu(*config, "jobs")
    assert_shown(jobs.stdout + jobs.stderr, "jobs")
    assert "\\x1b]0;pwned-title\\x07job" in jobs.stdout and "\\x9b31mlabel" in jobs.stdout

    doctor = homegpu(*config, "doctor")
    assert_shown(doctor.stdout + doctor.stderr, "doctor")
    assert MARKUP in doctor.stdout

    tfconfig = homegpu(*config, "tfconfig", "evil")
    assert_shown(tfconfig.stdout + tfconfig.stderr, "tfconfig")

    run = homegpu(*config, "run", "evil", "--no-tui", cwd=tmp_path)
    assert run.returncode != 0
    assert_shown(run.stdout + run.stderr, "run")
    assert "preflight node2: ✗" in run.stdout and "no python here" in run.stdout  # the preflight line
    assert "evil not started" in run.stderr and "no python here" in run.stderr  # the error line


def test_the_tui_shows_what_a_node_says_and_the_terminal_keeps_its_title_and_clipboard(
        hostile_cluster: Path, tmp_path: Path, terminal_factory):  # noqa: F811
    command = shlex.join(homegpu_argv("--config", str(hostile_cluster)))
    term = terminal_factory(f"{command}; echo homegpu exited with status $?; sleep 600", tmp_path,
                            options=(("set-clipboard", "on"),))
    term._run("select-pane", "-t", SESSION, "-T", "before")

    term.wait_for("703/700W", 60)  # node3's GPU is in the table
    term.keys("Down", "Down")  # node3's detail: the GPU's full name, and its process
    term.wait_for("user root", 10)  # the process's owner, after its name
    assert_untouched(term)
    screen = term.screen()
    assert "0 \\x1b]0;pwned" in screen, screen  # the nodes table's GPU column
    assert "\\x9b31m[bold red]x[/] H100" in screen and "\\x1b]52;c;cHduZWQ=\\x07" in screen, screen
    assert "python3 (19.6 GiB)" in screen, screen

    term.keys("d")  # doctor's report names the GPU, markup and all
    term.wait_for("Escape closes", 60)
    term.keys("End")  # node3 comes last
    term.wait_for("1× \\x1b]0;pwned-title", 10)

    def report_ends_with_the_gpu() -> str:  # the report may still grow as doctor's checks come: End again
        term.keys("End")
        screen = term.screen()
        report = [line.split("█")[1] for line in screen.splitlines() if line.count("█") >= 2]  # the modal's text
        return any("red]x[/] H100" in line for line in report) and screen
    wait_for(report_ends_with_the_gpu, 30, "the GPU's name wrapped onto the report's next line")
    term.keys("Escape")
    wait_for(lambda: "Escape closes" not in term.screen(), 10, "the report to close")

    term.keys("l")  # the launch dialog's device plan names the GPU (on one line: the node detail wraps it)
    screen = term.wait_for("worker 1  node3", 10)
    assert GPU_SHOWN in screen, screen
    term.keys("Enter")  # the launch fails: the job panel's preflight lines and the toast quote the stderr
    screen = term.wait_for("no python here", 60)
    assert "\\x1b]0;pwned-title\\x07\\x1b]52;c;cHduZWQ=\\x07\\x1b[2Jno python here" in screen, screen

    assert_untouched(term)
    term.keys("q")
    term.wait_for("homegpu exited with status 0", 30)
