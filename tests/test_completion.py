"""Tab completion and `homegpu --help`: the scripts --print-completion writes, the names `homegpu --complete`
lists for them, a real bash completing a line, and the commands' order in the help."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_for

from homegpu.remote.config import load_cluster
from homegpu.remote.queue import QueueClient, QueueDesk, QueueServer, QueueStore, socket_path
from homegpu.tui.cli.main import HELP_ORDER, build_parser

CLUSTER = """\
[[nodes]]
name = "desktop"
host = "192.168.1.20"

[[nodes]]
name = "closet"
host = "192.168.1.30"

[jobs.resnet]
epochs = 2

[jobs.bert]
epochs = 1
"""
SHELLS = ("bash", "zsh", "fish")
COMMANDS = tuple(next(action for action in build_parser()._actions if action.dest == "command").choices)


def run_homegpu(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """This checkout's `homegpu` (python -m, so the code under test even where another is installed)."""
    return subprocess.run([sys.executable, "-m", "homegpu.tui.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, env=env)


def names(*args: str, cwd: Path, env: dict[str, str] | None = None) -> list[str]:
    result = run_homegpu("--complete", *args, cwd=cwd, env=env)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    return result.stdout.splitlines()


@pytest.fixture(scope="module")
def scripts(tmp_path_factory) -> dict[str, str]:
    cwd = tmp_path_factory.mktemp("scripts")
    printed = {shell: run_homegpu("--print-completion", shell, cwd=cwd) for shell in SHELLS}
    assert all(result.returncode == 0 for result in printed.values()), {s: r.stderr for s, r in printed.items()}
    return {shell: result.stdout for shell, result in printed.items()}


@pytest.mark.parametrize("shell", SHELLS)
def test_the_printed_script_completes_every_command_and_is_valid_shell(scripts, shell, tmp_path):
    script = scripts[shell]
    for command in COMMANDS:
        assert re.search(rf"\b{command}\b", script), f"{command} is missing from the {shell} script"
    assert "homegpu --complete" in script and "--print-completion" in script
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed: its syntax is not checked")
    path = tmp_path / f"homegpu.{shell}"
    path.write_text(script)
    checked = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr


def test_the_bash_script_completes_jobs_nodes_and_queue_ids_where_the_commands_take_them(scripts):
    compgens = dict(re.findall(r"^_shtab_homegpu_(\w+)_COMPGEN=(\w+)$", scripts["bash"], re.MULTILINE))
    for command in ("run", "submit", "logs", "stop", "tfconfig"):
        assert compgens[f"{command}_pos_0"] == "_homegpu_complete_jobs", command
    for argument in ("logs___node", "image_build___node", "trust_pos_0", "wake_pos_0", "sleep_pos_0"):
        assert compgens[argument] == "_homegpu_complete_nodes", argument
    assert compgens["cancel_pos_0"] == compgens["submit___after"] == "_homegpu_complete_queue_ids"
    assert compgens.get("init___node") != "_homegpu_complete_nodes"  # it takes NAME=HOST: a new node
    assert compgens["run___config"] == "_shtab_compgen_files"


def test_complete_lists_the_jobs_and_nodes_of_the_cluster_file(tmp_path):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert names("jobs", cwd=tmp_path) == ["resnet", "bert"]  # ./cluster.toml
    assert names("nodes", cwd=tmp_path) == ["desktop", "closet"]
    assert names("jobs", "--config", str(tmp_path / "cluster.toml"), cwd=elsewhere) == ["resnet", "bert"]
    assert names("nodes", f"--config={tmp_path / 'cluster.toml'}", cwd=elsewhere) == ["desktop", "closet"]
    assert names("jobs", cwd=elsewhere) == ["demo"]  # the embedded default, as the commands would use
    assert names("nodes", "--local", cwd=tmp_path) == ["local"]


def test_complete_reads_a_config_path_with_a_tilde_as_typed_on_the_line(tmp_path):
    (tmp_path / "lab.toml").write_text(CLUSTER)
    assert names("jobs", "--config", "~/lab.toml", cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)}) \
        == ["resnet", "bert"]


def test_complete_lists_nothing_and_says_nothing_for_a_broken_file_or_an_unknown_kind(tmp_path):
    (tmp_path / "cluster.toml").write_text("[[nodes]]\nname = \n")
    assert names("jobs", cwd=tmp_path) == []
    assert names("nodes", "--config", str(tmp_path / "missing.toml"), cwd=tmp_path) == []
    assert names("colours", "--local", cwd=tmp_path) == []
    assert names(cwd=tmp_path) == []


def test_complete_lists_no_queue_ids_without_a_serve(tmp_path):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    assert names("queue-ids", cwd=tmp_path) == []


async def test_complete_lists_the_queue_ids_that_have_not_finished(tmp_path):
    """What `cancel` and `submit --after` take, asked of the serve of the cluster file on the line."""
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    spec = load_cluster(tmp_path / "cluster.toml")
    store = QueueStore(tmp_path / "queue.sqlite")
    server = await QueueServer(socket_path(spec), QueueDesk(spec, store)).start()
    try:
        client = QueueClient(server.path)
        waiting, cancelled = await client.submit("resnet"), await client.submit("bert")
        await client.cancel(cancelled.id)
        process = await asyncio.create_subprocess_exec(  # serve answers on this loop meanwhile
            sys.executable, "-m", "homegpu.tui.cli.main", "--complete", "queue-ids", "--config",
            str(tmp_path / "cluster.toml"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(process.communicate(), 60)
        assert (out.decode().splitlines(), err) == ([waiting.id], b"")
    finally:
        await server.close()
        store.close()
        shutil.rmtree(socket_path(spec).parent, ignore_errors=True)


def test_help_and_complete_load_only_what_they_need(tmp_path):
    """--help never loads shtab; `--complete` (run on every Tab) loads no command module and no SSH."""
    probe = ("import sys\nfrom homegpu.tui.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
             "except SystemExit:\n    pass\n"
             "print(' '.join(name for name in ('shtab', 'asyncssh', 'textual', 'homegpu.tui.cli.jobs') "
             "if name in sys.modules), file=sys.stderr)")
    loaded = {args: subprocess.run([sys.executable, "-c", probe, *args], cwd=tmp_path, capture_output=True,
                                   text=True, timeout=60).stderr.split()
              for args in (("--help",), ("--complete", "jobs"))}
    assert "shtab" not in loaded[("--help",)]
    assert loaded[("--complete", "jobs")] == []


def test_help_lists_the_commands_in_a_newcomers_order_one_line_each(tmp_path):
    result = run_homegpu("--help", cwd=tmp_path, env={**os.environ, "COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("  COMMAND\n", 1)[1].split("\n\n", 1)[0].splitlines()
    listed = [line.split()[0] for line in section]
    assert listed[:5] == ["init", "check", "doctor", "run", "status"]
    assert listed == list(HELP_ORDER) and sorted(listed) == sorted(COMMANDS)  # each line starts a command


class BashTerminal:
    """An interactive bash in a tmux of our own (its own socket), as a person types into it."""

    def __init__(self, cwd: Path, path: str) -> None:
        self.tmux = shutil.which("tmux")
        self.socket = f"homegpu-completion-{os.getpid()}"
        env = {name: value for name, value in os.environ.items() if name not in ("COLUMNS", "LINES")}
        env.update(PATH=path, PS1="$ ", HISTFILE="/dev/null")
        self._run(["new-session", "-d", "-s", "completion", "-x", "120", "-y", "30", "-c", str(cwd),
                   "bash --norc --noprofile -i"], env)

    def _run(self, args: list[str], env: dict[str, str] | None = None) -> str:
        return subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True, text=True, check=True,
                              env=env).stdout

    def keys(self, *keys: str) -> None:
        self._run(["send-keys", "-t", "completion", *keys])

    def screen(self) -> str:
        return self._run(["capture-pane", "-p", "-t", "completion"])

    def wait_for(self, *texts: str) -> str:
        try:
            return wait_for(lambda: all(text in (screen := self.screen()) for text in texts) and screen, 30,
                            repr(texts))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen was:\n{self.screen()}") from None

    def close(self) -> None:
        subprocess.run([self.tmux, "-L", self.socket, "kill-server"], capture_output=True)


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed (tests/run.sh installs it)")
def test_bash_completes_the_jobs_and_nodes_of_the_cluster_file_on_tab(scripts, tmp_path):
    (tmp_path / "cluster.toml").write_text(CLUSTER)
    other = tmp_path / "other.toml"
    other.write_text(CLUSTER.replace("desktop", "garage").replace("closet", "attic"))
    (tmp_path / "homegpu.bash").write_text(scripts["bash"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "homegpu"  # the `homegpu` the script runs on Tab: this checkout's, as the tests import it
    python_path = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if os.environ.get("PYTHONPATH") else ""
    wrapper.write_text(f'#!/bin/sh\n{python_path}exec {shlex.quote(sys.executable)} -m homegpu.tui.cli.main "$@"\n')
    wrapper.chmod(0o755)

    term = BashTerminal(tmp_path, f"{bin_dir}:{os.environ['PATH']}")
    try:
        term.keys("source homegpu.bash", "Enter", "homegpu ", "Tab", "Tab")
        term.wait_for("init", "doctor", "tfconfig", "cancel")
        term.keys("C-u", "C-l", "homegpu run ", "Tab", "Tab")
        term.wait_for("resnet", "bert")
        term.keys("C-u", "C-l", "homegpu --config other.toml logs resnet --node ", "Tab", "Tab")
        screen = term.wait_for("garage", "attic")
        assert "Traceback" not in screen and "not found" not in screen
        term.keys("C-u", "C-l", "homegpu stop r", "Tab")  # one match: completed on the line
        term.wait_for("homegpu stop resnet")
    finally:
        term.close()
