"""The real `homegpu` program in a real terminal (tmux), driven by keys as a person would.

It launches the two-node demo job on the sshd test cluster with `l`, stops it with `s`, and quits
with `q`, reading the screen with `tmux capture-pane` after each step.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import homegpu, homegpu_argv, wait_for, worker_processes, write_config


SOCKET = f"homegpu-test-{os.getpid()}"  # a tmux server of our own (one per xdist worker): the user's are never touched
SESSION = "tui"


class Terminal:
    """A tmux window running one command; `screen()` is what a person would see in it."""

    def __init__(self, command: str, cwd: Path, size: tuple[int, int] = (160, 48),
                 options: tuple[tuple[str, str], ...] = ()) -> None:
        """`options`: tmux server options set before `command` starts (("set-clipboard", "on"), say)."""
        self.tmux = shutil.which("tmux")
        assert self.tmux, "tmux is not installed (tests/run.sh installs it)"
        width, height = size
        first = [arg for name, value in options for arg in ("set-option", "-s", name, value, ";")]
        self._run("start-server", ";", *first,
                  "new-session", "-d", "-s", SESSION, "-x", str(width), "-y", str(height), "-c", str(cwd), command)
        self._run("resize-window", "-t", SESSION, "-x", str(width), "-y", str(height))  # tmux 3.2+ may shrink it
        self.server_pid = int(self._run("display-message", "-p", "#{pid}"))

    def _run(self, *args: str) -> str:
        # Without COLUMNS and LINES: readline (which pytest loads) exports 80 and 24 into this process's C
        # environment, and a program in the pane would believe them over the pane's own size.
        env = {name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")}
        return subprocess.run([self.tmux, "-L", SOCKET, *args], capture_output=True, text=True, check=True,
                              env=env).stdout

    def screen(self) -> str:
        return self._run("capture-pane", "-p", "-t", SESSION)

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", SESSION, *keys)

    def wait_for(self, text: str, timeout: float) -> str:
        """Wait until `text` is on the screen; the screen then. Fails showing the last screen."""
        try:
            return wait_for(lambda: text in (screen := self.screen()) and screen, timeout, repr(text))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen was:\n{self.screen()}") from None

    def close(self) -> None:
        """End the tmux server, and wait until it has gone: kill-server returns first, and a server started on the
        same socket meanwhile "exited unexpectedly" (seen once in the full suite)."""
        subprocess.run([self.tmux, "-L", SOCKET, "kill-server"], capture_output=True)
        wait_for(lambda: not _running(self.server_pid), 10, "the tmux server to exit")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def terminal_factory() -> Iterator:
    opened: list[Terminal] = []

    def open_terminal(command: str, cwd: Path, size: tuple[int, int] = (160, 48), **options) -> Terminal:
        opened.append(Terminal(command, cwd, size, **options))
        return opened[-1]

    yield open_terminal
    for terminal in opened:
        terminal.close()


def test_launch_and_stop_a_two_node_job_with_the_keys_then_quit(sim_cluster, tmp_path, terminal_factory):
    config = write_config(sim_cluster, tmp_path, epochs=50, steps_per_epoch=20)
    command = shlex.join(homegpu_argv("--config", str(config)))
    term = terminal_factory(f"{command}; echo homegpu exited with status $?; sleep 600", tmp_path)

    term.wait_for("● node2", 60)
    screen = term.wait_for("no job yet: press l", 5)
    assert "● node1" in screen and "● node3" in screen

    term.keys("l")
    term.wait_for("Launch a job", 10)
    screen = term.wait_for("node1 (chief, index 0) on node1 [process]", 10)  # the preview fills in after
    assert "TF_CONFIG=" in screen
    term.keys("Enter")
    term.wait_for("running  generation 1", 120)
    screen = term.wait_for("examples/s:", 180)
    assert "epoch " in screen and "loss " in screen
    assert worker_processes(sim_cluster)

    term.keys("s")
    term.wait_for("Every worker gets TERM", 10)
    term.keys("y")
    term.wait_for("stopped  generation 1", 60)
    assert not worker_processes(sim_cluster)

    term.keys("q")
    term.wait_for("homegpu exited with status 0", 30)


def test_at_80_by_24_dialogs_fit_and_leaving_a_job_running_says_how_to_come_back(
        sim_cluster, tmp_path, terminal_factory):
    config = write_config(sim_cluster, tmp_path, epochs=50, steps_per_epoch=20)
    command = shlex.join(homegpu_argv("--config", str(config)))
    term = terminal_factory(f"{command}; echo homegpu exited with status $?; sleep 600", tmp_path, (80, 24))

    screen = term.wait_for("● node2", 60)
    keys = screen.splitlines()[-1]
    assert keys.rstrip().endswith("?  more") and "Launch" in keys, keys  # no key cut mid-word

    term.keys("?")
    screen = term.wait_for("Escape closes", 10)  # the hint below the text: the text scrolls instead
    assert "Nodes" in screen
    term.keys("Escape")
    wait_for(lambda: "Escape closes" not in term.screen(), 10, "the help to close")  # else ESC+l reads as Alt-l

    term.keys("l")
    screen = term.wait_for("Launch a job", 10)
    assert "Launch " in screen.split("Launch a job", 1)[1] and "Cancel" in screen  # the buttons fit
    term.keys("Enter")
    term.wait_for("running", 120)

    term.keys("q")
    term.wait_for("Leave running", 10)
    term.keys("l")
    screen = term.wait_for("homegpu exited with status 0", 60)
    assert "demo is still running on its nodes" in screen and "homegpu stop demo" in screen
    assert worker_processes(sim_cluster)
    stop = homegpu("--config", str(config), "stop", "demo")
    assert stop.returncode == 0, stop.stderr
    assert not worker_processes(sim_cluster)
