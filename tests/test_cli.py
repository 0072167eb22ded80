"""The installed `homegpu` command, run as a user runs it: a subprocess in a directory of its own."""

from __future__ import annotations

import argparse
import getpass
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import homegpu

from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.nodes import NodeError, ssh_target
from homegpu.remote.nodes.connect import open_transport
from homegpu.tui.cli.common import UserError
from homegpu.tui.cli.jobs import _one_run
from homegpu.tui.cli.main import build_parser

REPO = Path(__file__).resolve().parents[1]


def test_help_lists_the_commands(tmp_path):
    result = homegpu("--help", cwd=tmp_path)
    assert result.returncode == 0
    for word in ("check", "init", "--config", "--version", "embedded default"):
        assert word in result.stdout


def test_version(tmp_path):
    result = homegpu("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("homegpu ")


def test_check_without_config_uses_embedded_default(tmp_path):
    result = homegpu("check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "<embedded default>" in result.stdout
    assert "local" in result.stdout and "process" in result.stdout


def test_check_prints_the_example_cluster(tmp_path):
    result = homegpu("--config", str(REPO / "cluster.toml"), "check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for name in ("desktop", "closet", "laptop", "10.10.0.20", "rtx3060"):
        assert name in result.stdout
    assert "the rest of the machines: RAPL where the node's user can read it, else estimated: closet 55-140 W" \
        in result.stdout


def test_check_reads_cluster_toml_in_the_current_directory(tmp_path):
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "box"\nhost = "10.1.2.3"\n')
    result = homegpu("check", cwd=tmp_path)
    assert result.returncode == 0 and "10.1.2.3" in result.stdout


def test_check_shows_where_ssh_really_goes_and_where_each_value_comes_from(tmp_path, monkeypatch):
    """An alias whose ssh config sets HostName, Port and User: homegpu connects with them, so check says so."""
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host closet\n    HostName 192.168.1.30\n    Port 2222\n    User alice\n")
    monkeypatch.setenv("HOMEGPU_SSH_CONFIG", str(ssh_config))
    (tmp_path / "cluster.toml").write_text(
        '[[nodes]]\nname = "closet"\nhost = "closet"\n'
        '[[nodes]]\nname = "desk"\nhost = "10.1.2.3"\n'
        '[[nodes]]\nname = "box"\nhost = "box"\nport = 2200\nuser = "bob"\n'
        '[[nodes]]\nname = "here"\nhost = "local"\n')
    result = homegpu("check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: " ".join(line.split()) for line in result.stdout.splitlines() if line.startswith("  ")}
    assert rows["closet"].startswith("closet closet → 192.168.1.30 2222 (ssh config) alice (ssh config) ")
    assert rows["desk"].startswith(f"desk 10.1.2.3 22 (default) {getpass.getuser()} (login name) ")
    assert rows["box"].startswith("box box 2200 (cluster.toml) bob (cluster.toml) ")
    assert rows["here"].startswith("here local - - ")


def test_check_reads_the_ssh_config_in_home_as_connecting_does(tmp_path, home_ssh_config):
    """No HOMEGPU_SSH_CONFIG: ~/.ssh/config decides where the connection goes, so check says so, not 22 and
    the login name."""
    home_ssh_config.write_text("Host closet\n    HostName 192.168.1.30\n    Port 2300\n    User alice\n")
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "closet"\nhost = "closet"\n')
    result = homegpu("check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (row,) = [" ".join(line.split()) for line in result.stdout.splitlines() if line.startswith("  closet ")]
    assert row.startswith("closet closet → 192.168.1.30 2300 (ssh config) alice (ssh config) "), row
    spec = load_cluster(tmp_path / "cluster.toml")
    target = ssh_target(spec, spec.nodes[0])
    assert (target.host, target.port, target.user, target.problem) == ("192.168.1.30", 2300, "alice", "")


async def test_an_ssh_config_that_does_not_read_is_one_line_in_check_and_when_connecting(tmp_path, home_ssh_config):
    """asyncssh refuses the file: check says which line and why instead of showing defaults as if they held,
    and connecting says the same (a node offline with its reason, not a crashed session)."""
    home_ssh_config.write_text("Host closet\n    HostName 192.168.1.30\n    Port\n")
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "closet"\nhost = "closet"\n')
    result = homegpu("check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    why = f"{home_ssh_config} line 3: Missing Port value"
    (line,) = [line for line in result.stdout.splitlines() if why in line]
    assert line.startswith("✗ ssh config: "), result.stdout
    spec = load_cluster(tmp_path / "cluster.toml")
    assert why in ssh_target(spec, spec.nodes[0]).problem
    with pytest.raises(NodeError, match=re.escape(why)):
        await open_transport(spec, spec.nodes[0])


def test_bad_config_is_one_line_exit_2_no_traceback(tmp_path):
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "box"\nhost = "10.1.2.3"\nport = 99999\n')
    result = homegpu("check", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert "cluster.toml:4: [[nodes]] #1.port: port 99999 is out of range" in result.stderr


def test_missing_config_file_is_a_clear_error(tmp_path):
    result = homegpu("--config", "missing.toml", "check", cwd=tmp_path)
    assert result.returncode == 2 and "missing.toml: file: not found" in result.stderr


def test_init_writes_a_file_that_loads_back(tmp_path):
    result = homegpu("init", "--node", "desktop=192.168.1.20", "--node", "closet=closet:2222",
                     "--node", "v6=[fe80::2]:22", "--user", "alice", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    spec = load_cluster(tmp_path / "cluster.toml")
    assert [(n.name, n.host, n.port) for n in spec.nodes] == [
        ("desktop", "192.168.1.20", None), ("closet", "closet", 2222), ("v6", "fe80::2", 22)]
    assert spec.ssh.user == "alice"
    assert homegpu("check", cwd=tmp_path).returncode == 0


def test_init_without_nodes_writes_this_machine(tmp_path):
    assert homegpu("init", cwd=tmp_path).returncode == 0
    (node,) = load_cluster(tmp_path / "cluster.toml").nodes
    assert node.is_local and node.runtime == "process"


def test_init_refuses_to_overwrite_without_force(tmp_path):
    target = tmp_path / "cluster.toml"
    target.write_text("# mine\n")
    result = homegpu("init", cwd=tmp_path)
    assert result.returncode == 2 and "--force" in result.stderr
    assert target.read_text() == "# mine\n"
    assert homegpu("init", "--force", cwd=tmp_path).returncode == 0
    assert target.read_text() != "# mine\n"


@pytest.mark.parametrize("option, message", [
    ("desktop", "expected NAME=HOST[:PORT]"),
    ("desktop=host:ssh", "port 'ssh' is not a number"),
    ("desktop=$(reboot)", "shell metacharacters"),
    ("-x=host", "invalid name"),
])
def test_init_rejects_bad_node_options_and_writes_nothing(tmp_path, option, message):
    result = homegpu("init", f"--node={option}", cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "cluster.toml").exists()


def test_local_uses_the_embedded_default_even_beside_a_cluster_toml(tmp_path):
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "box"\nhost = "10.1.2.3"\n')
    result = homegpu("--local", "check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "<embedded default>" in result.stdout and "10.1.2.3" not in result.stdout
    assert "demo" in result.stdout


def test_local_and_config_exclude_each_other(tmp_path):
    result = homegpu("--local", "--config", "x.toml", "check", cwd=tmp_path)
    assert result.returncode == 2 and "not allowed with" in result.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_config_and_local_work_before_or_after_the_command(tmp_path, where):
    example = Path(__file__).parents[1] / "cluster.toml"
    (tmp_path / "cluster.toml").write_text(example.read_text())
    config = ["--config", str(example)]
    given = homegpu(*config, "check", cwd=tmp_path / "..") if where == "before" else \
        homegpu("check", *config, cwd=tmp_path / "..")
    assert given.returncode == 0, given.stderr
    assert "3 nodes" in given.stdout
    local = homegpu("--local", "check", cwd=tmp_path) if where == "before" else homegpu("check", "--local", cwd=tmp_path)
    assert local.returncode == 0 and "<embedded default>" in local.stdout and "1 node" in local.stdout


def _parsers(parser):
    """(command path, parser) for the main parser and every command under it, however deep."""
    yield "homegpu", parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for path, found in _parsers(sub):
                    yield f"{name} {path}".replace(" homegpu", ""), found


def test_every_command_and_argument_has_help_text():
    missing = []
    for path, parser in _parsers(build_parser()):
        if not parser.description:
            missing.append(f"{path} (its description)")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {choice.dest}" for choice in action._choices_actions if not choice.help]
            elif not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"no help text: {missing}"


def test_check_lists_the_jobs_or_says_how_to_add_one(tmp_path):
    example = homegpu("--config", str(Path(__file__).parents[1] / "cluster.toml"), "check")
    assert example.returncode == 0
    assert "JOB" in example.stdout and "cifar  built-in trainer" in example.stdout
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "box"\nhost = "10.1.2.3"\n')
    bare = homegpu("check", cwd=tmp_path)
    assert bare.returncode == 0 and 'No job yet: add one, e.g. a [jobs.demo] table with nodes = ["box"]' in bare.stdout


def test_check_shows_the_sleep_and_wake_keys_and_min_workers(tmp_path):
    (tmp_path / "cluster.toml").write_text(
        '[[nodes]]\nname = "desk"\nhost = "10.0.0.2"\nmac = "A8:A1:59:0C:22:7E"\nsleep_after = "30m"\n'
        'sleep_command = "loginctl suspend"\n\n'
        '[[nodes]]\nname = "laptop"\nhost = "10.0.0.3"\nmac = "a8:a1:59:0c:22:7f"\nwake_via = "desk"\n'
        'wake_timeout = "5m"\n\n[[nodes]]\nname = "closet"\nhost = "10.0.0.4"\n\n'
        '[jobs.demo]\nmin_workers = 2\non_fewer_workers = "keep-worker-batch"\n\n[jobs.plain]\n')
    out = homegpu("check", cwd=tmp_path).stdout
    assert "    desk: woken by a8:a1:59:0c:22:7e, 120s to boot; asleep after 1800s idle by 'loginctl suspend'" in out
    assert "    laptop: woken by a8:a1:59:0c:22:7f from desk, 300s to boot; never put to sleep by serve" in out
    assert "closet:" not in out, out  # neither woken nor put to sleep
    rows = {line.split()[0]: line.split() for line in out.splitlines()[out.splitlines().index(next(
        line for line in out.splitlines() if line.split()[:1] == ["JOB"])):] if line.strip()}
    assert rows["JOB"][-2:] == ["MIN", "WORKERS"]
    assert rows["demo"][-2:] == ["2", "(keep-worker-batch)"] and rows["plain"][-1] == "all", out
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "box"\nhost = "10.1.2.3"\n')
    assert "  sleep and wake: none (mac in [[nodes]]" in homegpu("check", cwd=tmp_path).stdout


def test_report_writes_the_latest_runs_page_and_names_a_missing_run(tmp_path):
    runs = tmp_path / "experiments"
    empty = homegpu("report", "--experiments", str(runs))
    assert empty.returncode == 2 and empty.stderr.count("\n") == 1 and "no runs in" in empty.stderr
    run_dir = runs / "demo-20261122-030416-1749"
    run_dir.mkdir(parents=True)
    shutil.copy(Path(__file__).parent / "fixtures" / "tui" / "demo_metrics.jsonl", run_dir / "metrics.jsonl")
    made = homegpu("report", "--experiments", str(runs))
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"report: {run_dir / 'report.html'}\n")
    assert (run_dir / "report.html").read_text().startswith("<!DOCTYPE html>")
    unknown = homegpu("report", "nope", "--experiments", str(runs))
    assert unknown.returncode == 2 and "no run 'nope'" in unknown.stderr


def test_init_takes_the_nodes_runtime(tmp_path):
    result = homegpu("init", "--node", "box0=box0", "--node", "box1=box1", "--runtime", "process", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    spec = load_cluster(tmp_path / "cluster.toml")
    assert [node.runtime for node in spec.nodes] == ["process", "process"] and "demo" in spec.jobs


@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_image_build_finds_the_frameworks_dockerfile_from_any_directory(framework, tmp_path, monkeypatch):
    """Away from a checkout's folder (no ./assets/ here), `image build` takes the one homegpu ships."""
    from homegpu.tui.cli.image import DOCKERFILES, find_dockerfile
    monkeypatch.chdir(tmp_path)
    found = find_dockerfile(None, framework)
    assert found == REPO / DOCKERFILES[framework]
    assert found.read_text().count("\nFROM ") == 1


def test_a_pytorch_job_defaults_to_the_pytorch_image(tmp_path):
    config = tmp_path / "cluster.toml"
    config.write_text('[[nodes]]\nname = "a"\nhost = "localhost"\nruntime = "docker"\n\n'
                      '[jobs.tf]\n\n[jobs.torch]\nframework = "pytorch"\n')
    jobs = load_cluster(config).jobs
    assert (jobs["tf"].image, jobs["torch"].image) == ("homegpu/tensorflow:2.21", "homegpu/pytorch:2.14")


def test_stop_and_logs_pick_one_of_a_jobs_runs_by_run_id_or_say_which_there_are() -> None:
    job = SimpleNamespace(name="sweep")
    runs = [(f"sweep-2026112{n}", 1) for n in range(8, 1, -1)]  # newest first, as JobRuntimes.runs gives them
    assert _one_run(job, runs[:1], "", "running") == runs[0] and _one_run(job, [], "", "running") is None
    assert _one_run(job, runs, "sweep-20261125", "running") == ("sweep-20261125", 1)
    with pytest.raises(UserError, match=r"^sweep runs 7 times at once \(sweep-20261128, .*, sweep-20261122\): name one "
                                        r"with --run RUN_ID"):
        _one_run(job, runs, "", "running")
    with pytest.raises(UserError) as refused:
        _one_run(job, runs, "sweep-1", "found")
    assert str(refused.value) == ("no run sweep-1 of sweep found on its nodes (those found: sweep-20261128, "
                                  "sweep-20261127, sweep-20261126, sweep-20261125, sweep-20261124 and 2 more)")
    with pytest.raises(UserError, match=r"^no run sweep-1 of sweep running on its nodes$"):
        _one_run(job, [], "sweep-1", "running")
