"""cluster.toml parsing and validation: good files, and one clear located error per mistake."""

from __future__ import annotations

import sys
from pathlib import Path
from textwrap import dedent
from types import MappingProxyType

import pytest

from homegpu.remote.config.cluster_spec import (
    AlertRules, ClusterSpec, ConfigError, NodeSpec, SshDefaults, embedded_default, find_config, load_cluster,
    parse_cluster,
)
from homegpu.remote.config.job_spec import DEFAULT_IMAGE, JobSpec
from homegpu.remote.config.writer import cluster_to_toml, starter_cluster

REPO = Path(__file__).resolve().parents[1]

GOOD = dedent("""\
    [cluster]
    name = "lab"
    user = "alice"
    connect_timeout = 3

    [[nodes]]
    name = "desktop"
    host = "192.168.1.20"
    address = "10.0.0.20"
    tags = ["gpu"]

    [[nodes]]
    name = "laptop"
    host = "laptop"
    port = 2222
    runtime = "process"
    python = "/opt/tf/bin/python"
    """)

NODE = '[[nodes]]\nname = "a"\nhost = "10.0.0.1"\n'


def test_good_file_parses_into_typed_spec():
    spec = parse_cluster(GOOD, "lab.toml")
    assert spec.name == "lab"
    assert spec.source == "lab.toml"
    assert spec.ssh == SshDefaults(user="alice", connect_timeout=3.0)
    assert isinstance(spec.ssh.connect_timeout, float)
    desktop, laptop = spec.nodes
    assert desktop == NodeSpec(name="desktop", host="192.168.1.20", address="10.0.0.20", tags=("gpu",))
    assert desktop.cluster_address == "10.0.0.20"
    assert laptop.cluster_address == "laptop"
    assert (laptop.port, laptop.runtime, laptop.python) == (2222, "process", "/opt/tf/bin/python")
    assert spec.work_dir_of(laptop) == "~/.homegpu"


def test_spec_is_frozen():
    spec = parse_cluster(GOOD)
    with pytest.raises(AttributeError):
        spec.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.jobs["x"] = {}  # type: ignore[index]


JOB = NODE + '[[nodes]]\nname = "b"\nhost = "10.0.0.2"\n\n[jobs.train]\n'


def test_job_table_parses_with_defaults():
    spec = parse_cluster(JOB + 'epochs = 3\nenv = { TF_CPP_MIN_LOG_LEVEL = "1" }\nnodes = ["b"]\n')
    job = spec.jobs["train"]
    assert (job.name, job.epochs, job.nodes, dict(job.env)) == ("train", 3, ("b",), {"TF_CPP_MIN_LOG_LEVEL": "1"})
    assert job.uses_trainer and job.port == 23456 and job.restart == "on-failure"
    assert job.image == DEFAULT_IMAGE and job.python_for(spec.nodes[0]) == "python3"


def test_script_job():
    job = parse_cluster(JOB + 'script = "./mnist/train.py"\nargs = ["--lr", "0.01"]\npython = "/opt/tf/bin/python"\n'
                        ).jobs["train"]
    assert not job.uses_trainer and job.args == ("--lr", "0.01") and job.python == "/opt/tf/bin/python"


def test_embedded_default_has_a_two_worker_demo_job():
    job = embedded_default().jobs["demo"]
    assert job.workers_per_node == 2 and job.uses_trainer and job.data == "synthetic"


def test_embedded_default_is_this_machine_as_a_process_node():
    spec = embedded_default()
    (node,) = spec.nodes
    assert node.is_local and node.runtime == "process"
    assert node.cluster_address == "127.0.0.1"
    assert load_cluster(None) == spec


def test_find_config_prefers_flag_then_cwd_then_default(tmp_path):
    assert find_config(None, cwd=tmp_path) is None
    (tmp_path / "cluster.toml").write_text(NODE)
    assert find_config(None, cwd=tmp_path) == tmp_path / "cluster.toml"
    assert find_config("other.toml", cwd=tmp_path) == Path("other.toml")


def test_repository_example_is_valid():
    spec = load_cluster(REPO / "cluster.toml")
    assert [node.name for node in spec.nodes] == ["desktop", "closet", "laptop"]
    assert {node.runtime for node in spec.nodes} == {"docker", "process"}


@pytest.mark.parametrize("spec", [
    embedded_default(),
    parse_cluster(GOOD),
    ClusterSpec(name="x", nodes=(NodeSpec(name="n", host="h", port=22, user="u", identity_file="~/k",
                                          address="1.2.3.4", runtime="process", python="py",
                                          tags=("a", "b"), work_dir="/w"),),
                ssh=SshDefaults(known_hosts="/kh", keepalive_count_max=5), stats_interval=0.5, work_dir="/d",
                jobs=MappingProxyType({"t": JobSpec(name="t", image="me/tf:1", script="s/train.py", args=("-x",),
                                                    env=MappingProxyType({"A": "1"}), nodes=("n",), keras="tf-keras",
                                                    restart="never", stall_timeout=60.0)}),
                alerts=AlertRules(gpu_temperature=85.0, node_offline_seconds=60.0, job_failed=True, queued_runs=True,
                                  command=("curl", "-d", "{message}", "https://ntfy.sh/t"), command_timeout=5.0)),
])
def test_writer_round_trip(spec):
    text = cluster_to_toml(spec)
    back = parse_cluster(text, spec.source)
    assert back == spec


def test_starter_cluster_writes_a_demo_job_across_the_given_nodes(tmp_path):
    nodes = (NodeSpec(name="desktop", host="192.168.1.20"), NodeSpec(name="laptop", host="laptop", port=2222,
                                                                      runtime="process"))
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_to_toml(starter_cluster(nodes, user="alice")), encoding="utf-8")
    text = path.read_text(encoding="utf-8")
    assert "[jobs.demo]" in text and 'data = "synthetic"' in text
    spec = load_cluster(path)
    assert spec.nodes == nodes and spec.ssh.user == "alice" and spec.name == "home"
    (job,) = spec.jobs.values()
    assert (job.name, job.uses_trainer, job.data, job.nodes, job.workers_per_node) == ("demo", True, "synthetic",
                                                                                       (), 1)


def test_the_starter_files_commented_price_and_budgets_work_once_uncommented():
    text = cluster_to_toml(starter_cluster(name="lab"))
    assert parse_cluster(text).tariff.priced is False
    for key in ("price_per_kwh", "currency", "tariffs", "[alerts]", "budget_per_day", "budget_per_run"):
        text = text.replace(f"# {key}", key)
    spec = parse_cluster(text)
    assert (spec.tariff.price_per_kwh, spec.tariff.currency, len(spec.tariff.periods)) == (0.35, "EUR", 1)
    assert (spec.alerts.budget_per_day, spec.alerts.budget_per_run) == (2.5, 1.0)


def test_starter_cluster_without_nodes_is_this_machine_with_two_workers():
    """Its workers run under the Python homegpu runs under, which has the framework extras homegpu was installed
    with, as the embedded default's do: `python3` on PATH (outside the venv) may have no TensorFlow or torch."""
    spec = parse_cluster(cluster_to_toml(starter_cluster(name="lab")))
    (node,) = spec.nodes
    assert (node.name, node.is_local, node.runtime, node.python) == ("local", True, "process", sys.executable)
    assert spec.nodes == embedded_default().nodes
    assert spec.name == "lab" and spec.jobs["demo"].workers_per_node == 2


def test_init_then_check_and_tfconfig_need_no_edit(tmp_path, capsys):
    from homegpu.tui.cli.main import main

    config = str(tmp_path / "cluster.toml")
    assert main(["--config", config, "init", "--node", "a=10.0.0.1", "--node", "b=10.0.0.2:2222"]) == 0
    assert "run demo" in capsys.readouterr().out
    assert main(["--config", config, "check"]) == 0
    assert "jobs: demo" in capsys.readouterr().out
    assert main(["--config", config, "tfconfig"]) == 0
    assert capsys.readouterr().out.count('"worker": ["10.0.0.1:23456", "10.0.0.2:23456"]') == 2


def test_one_default_cluster_name():
    assert parse_cluster(NODE).name == embedded_default().name == starter_cluster().name == "home"


def test_a_byte_order_mark_is_accepted():
    assert parse_cluster("\ufeff" + GOOD) == parse_cluster(GOOD)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_cluster(tmp_path / "nope.toml")
    assert "nope.toml" in str(err.value) and "homegpu init" in str(err.value)


ALERTS = NODE + "[alerts]\n"

# (toml text, expected line, expected key, a phrase of the problem, a phrase of the hint)
BAD_INPUTS = [
    ("[cluster\nname = 'x'\n", 1, "syntax", "invalid TOML", "fix the TOML syntax"),
    ('[cluster]\nname = "x"\nname = "y"\n' + NODE, 3, "syntax", "invalid TOML", "fix the TOML syntax"),
    ('[cluster]\nname = "x"\n', None, "[[nodes]]", "no nodes", "add a [[nodes]] table"),
    ('nodes = []\n', 1, "[[nodes]]", "no nodes", "add at least one"),
    ('nodes = "a"\n', 1, "[[nodes]]", "array of tables", "[[nodes]] table"),
    ('colour = "red"\n' + NODE, 1, "colour", "unknown key 'colour'", "[cluster], [[nodes]]"),
    ('[cluster]\nusr = "bob"\n' + NODE, 2, "[cluster].usr", "unknown key 'usr'", "did you mean 'user'?"),
    (NODE + 'hots = "x"\n', 4, "[[nodes]] #1.hots", "unknown key", "did you mean 'host'?"),
    ('[[nodes]]\nname = "a"\n', 1, "[[nodes]] #1", "has no host", 'host = "ADDRESS"'),
    ('[[nodes]]\nhost = "a"\n', 1, "[[nodes]] #1", "has no name", 'add name = "..."'),
    (NODE + NODE, 5, "[[nodes]] #2.name", "duplicate node name 'a'", "own name"),
    (NODE + '[[nodes]]\nname = "b"\nhost = "10.0.0.1"\nport = 22\n', 6, "[[nodes]] #2.host",
     "duplicate address:port 10.0.0.1:22", "own host or port"),
    (NODE + "port = 0\n", 4, "[[nodes]] #1.port", "out of range", "between 1 and 65535"),
    (NODE + "port = 65536\n", 4, "[[nodes]] #1.port", "out of range", "between 1 and 65535"),
    (NODE + 'port = "22"\n', 4, "[[nodes]] #1.port", "expected an integer, got a string", "port = 2222"),
    (NODE + "port = true\n", 4, "[[nodes]] #1.port", "expected an integer, got a boolean", "port = 2222"),
    ('[[nodes]]\nname = "a"\nhost = "x; rm -rf ~"\n', 3, "[[nodes]] #1.host", "shell metacharacters",
     "without them"),
    ('[[nodes]]\nname = "a"\nhost = "$(reboot)"\n', 3, "[[nodes]] #1.host", "shell metacharacters",
     "without them"),
    ('[[nodes]]\nname = "a"\nhost = "-oProxyCommand=sh"\n', 3, "[[nodes]] #1.host", "starts with '-'",
     "without the leading '-'"),
    (NODE + 'address = "10.0.0.2|nc"\n', 4, "[[nodes]] #1.address", "shell metacharacters", "without them"),
    ('[cluster]\nwork_dir = "/tmp/w; reboot"\n' + NODE, 2, "[cluster].work_dir", "shell metacharacters",
     "path without them"),
    ('[cluster]\nidentity_file = "-i/etc/shadow"\n' + NODE, 2, "[cluster].identity_file", "starts with '-'",
     "without the leading '-'"),
    (NODE + 'python = "python3 && curl x"\n', 4, "[[nodes]] #1.python", "shell metacharacters", "without them"),
    (NODE + 'runtime = "podman"\n', 4, "[[nodes]] #1.runtime", "unknown runtime 'podman'", '"docker"'),
    ('[cluster]\nconnect_timeout = "5 secs"\n' + NODE, 2, "[cluster].connect_timeout", "'5 secs' is not a duration",
     "connect_timeout = 1.5"),
    ('[cluster]\nstats_interval = 0\n' + NODE, 2, "[cluster].stats_interval", "must be from 0.1 to 3600 seconds",
     "in that range"),
    ('[cluster]\nkeepalive_count_max = 1.5\n' + NODE, 2, "[cluster].keepalive_count_max",
     "expected an integer", "keepalive_count_max = 5"),
    ('cluster = 3\n' + NODE, 1, "[cluster]", "must be a table", "[cluster] table"),
    ('[[nodes]]\nname = "my node"\nhost = "h"\n', 2, "[[nodes]] #1.name", "invalid name", "letters, digits"),
    (NODE + 'tags = ["gpu", 3]\n', 4, "[[nodes]] #1.tags", "invalid tag 3", "tags = ["),
    (NODE + 'tags = "gpu"\n', 4, "[[nodes]] #1.tags", "expected a list", 'tags = ["gpu", "rtx4090"]'),
    (NODE + 'user = "root;id"\n', 4, "[[nodes]] #1.user", "shell metacharacters", "user name without them"),
    (NODE + 'jobs = 1\n', 4, "[[nodes]] #1.jobs", "unknown key 'jobs'", "[[nodes]] reference"),
    (NODE + '[jobs]\ntrain = 5\n', 5, "[jobs.train]", "must be a table", "[jobs.train] table"),
    (JOB + 'epoch = 3\n', 9, "[jobs.train].epoch", "unknown key 'epoch'", "did you mean 'epochs'?"),
    (JOB + 'epochs = 0\n', 9, "[jobs.train].epochs", "must be from 1 to 1,000,000, got 0", "in that range"),
    (JOB + 'script = "train.py"\nbatch_size = 32\n', 10, "[jobs.train].batch_size",
     "the built-in trainer's key, but this job runs train.py, which never sees it", 'args = ["--batch-size", "..."]'),
    (JOB + 'nodes = ["a", "c"]\n', 9, "[jobs.train].nodes", "unknown node 'c'", "a, b"),
    (JOB + 'script = "train.py"\ncode_dir = "model"\n', 9, "[jobs.train].script",
     "'train.py' is not inside code_dir 'model'", 'script = "model/train.py"'),
    (JOB + 'script = "model/../train.py"\ncode_dir = "model"\n', 9, "[jobs.train].script",
     "is not inside code_dir", "the cluster file's folder"),
    (JOB + 'nodes = ["a", "a"]\n', 9, "[jobs.train].nodes", "listed twice", "each node once"),
    (JOB + 'restart = "always"\n', 9, "[jobs.train].restart", "unknown value 'always'", '"on-failure"'),
    (JOB + 'port = 99999\n', 9, "[jobs.train].port", "out of range", "between 1 and 65535"),
    (JOB + 'image = "My Image"\n', 9, "[jobs.train].image", "invalid image name", "homegpu/tensorflow"),
    (JOB + 'data = "imagenet"\n', 9, "[jobs.train].data", "unknown data source", '"npz:PATH"'),
    (JOB + 'env = { "1X" = "a" }\n', 9, "[jobs.train].env.1X", "invalid variable name", "letters, digits"),
    (JOB + 'env = { X = 1 }\n', 9, "[jobs.train].env.X", "not a string", 'X = "1"'),
    (JOB + 'script = "train.py; rm -rf /"\n', 9, "[jobs.train].script", "shell metacharacters", "without them"),
    (JOB + 'args = ["--lr", 0.1]\n', 9, "[jobs.train].args", "0.1 is not a string", "in quotes"),
    (JOB + 'max_restarts = -1\n', 9, "[jobs.train].max_restarts", "must be from 0 to 1,000, got -1", "in that range"),
    (JOB + 'model = "vit"\n', 9, "[jobs.train].model", "unknown value 'vit'", '"cnn"'),
    ('[cluster]\nkeepalive_interval = nan\n' + NODE, 2, "[cluster].keepalive_interval",
     "must be from 0.1 to 3600 seconds, got nan", "in that range"),
    ('[cluster]\nstats_interval = 5e-324\n' + NODE, 2, "[cluster].stats_interval", "got 5e-324", "in that range"),
    ('[cluster]\nconnect_timeout = inf\n' + NODE, 2, "[cluster].connect_timeout", "got inf", "in that range"),
    (JOB + 'stall_timeout = nan\n', 9, "[jobs.train].stall_timeout", "from 1 to 604800 seconds", "in that range"),
    (JOB + 'workers_per_node = 100000\n', 9, "[jobs.train].workers_per_node", "from 1 to 64 workers, got 100000",
     "in that range"),
    (JOB + 'port = 65535\nworkers_per_node = 2\n', 9, "[jobs.train].port", "ports 65535 to 65536, past 65535",
     "at most 65534"),
    (JOB + 'epochs = 0x' + 'f' * 5000 + '\n', 9, "[jobs.train].epochs", "an integer of about 6021 digits",
     "in that range"),
    (JOB + 'on_fewer_workers = "keep-worker-batch"\n', 9, "[jobs.train].on_fewer_workers",
     "does nothing without min_workers", "set min_workers too"),
    (JOB + 'checkpoint = "snapshot.pt"\n', 9, "[jobs.train].checkpoint",
     "the built-in trainer keeps its own backup on every worker", "remove checkpoint"),
    (JOB + 'script = "train.py"\ncheckpoint = "/tmp/snapshot.pt"\n', 10, "[jobs.train].checkpoint",
     "'/tmp/snapshot.pt' is not a path in the script's working dir", 'checkpoint = "snapshot.pt"'),
    (JOB + 'script = "train.py"\ncheckpoint = "../snapshot.pt"\n', 10, "[jobs.train].checkpoint",
     "the only place homegpu carries files from", "relative to where the script runs"),
    (NODE + 'port = ' + '9' * 5000 + '\n', 4, "[[nodes]] #1.port", "more than 4300 digits", "ordinary number"),
    (NODE + 'tags = ' + '[' * 5000 + ']' * 5000 + '\n', 4, "[[nodes]] #1.tags", "nested too deeply",
     "at most 8 levels"),
    (NODE + 'tags = [[[[[[[["a"]]]]]]]]\n', 4, "[[nodes]] #1.tags.0.0.0.0.0.…", "more than 8 levels", "brackets"),
    ('[jobs.' + '.'.join('j' * 9) + ']\n' + NODE, 1, "[jobs.j].j.j.j.j.j.j.…", "key of 10 dotted parts", "at most 8"),
    ('[cluster]\nname = "home\\n"\n' + NODE, 2, "[cluster].name", "invalid name 'home\\n'", "up to 64"),
    (NODE + '"a\\nb" = 1\n', 1, "[[nodes]] #1.'a\\nb'", "unknown key 'a\\nb'", "[[nodes]] reference"),
    (NODE + 'alerts = 1\n', 4, "[[nodes]] #1.alerts", "unknown key 'alerts'", "[[nodes]] reference"),
    ('alerts = 3\n' + NODE, 1, "[alerts]", "must be a table", "[alerts] table"),
    (ALERTS + 'gpu_temp = 80\n', 5, "[alerts].gpu_temp", "unknown key 'gpu_temp'", "did you mean 'gpu_temperature'?"),
    (ALERTS + 'gpu_temperature = "hot"\n', 5, "[alerts].gpu_temperature", "expected a number, got a string",
     "gpu_temperature = 85"),
    (ALERTS + 'gpu_temperature = 500\n', 5, "[alerts].gpu_temperature", "must be from 1 to 150 °C, got 500.0",
     "in that range"),
    (ALERTS + 'gpu_memory_percent = 101\n', 5, "[alerts].gpu_memory_percent", "from 1 to 100%", "in that range"),
    (ALERTS + 'node_offline_seconds = nan\n', 5, "[alerts].node_offline_seconds", "got nan", "in that range"),
    (ALERTS + 'node_offline_seconds = true\n', 5, "[alerts].node_offline_seconds", "expected a duration, got a boolean", "node_offline_seconds = 1.5"),
    (ALERTS + 'job_failed = "yes"\n', 5, "[alerts].job_failed", "expected true or false", "job_failed = true"),
    (ALERTS + 'queued_runs = "yes"\n', 5, "[alerts].queued_runs", "expected true or false", "queued_runs = true"),
    (ALERTS + 'queued_run = true\n', 5, "[alerts].queued_run", "unknown key 'queued_run'",
     "did you mean 'queued_runs'?"),
    (ALERTS + 'command = ["curl", "{queue}"]\n', 5, "[alerts].command", "unknown placeholder '{queue}'",
     "{queue_id}"),
    (ALERTS + 'command = []\n', 5, "[alerts].command", "the command is empty", 'command = ["notify-send"'),
    (ALERTS + 'command = "notify-send hi"\n', 5, "[alerts].command", "expected a list, got a string",
     'write it like command = ["notify-send", "{title}", "{message}"]'),
    (ALERTS + 'command = ["notify-send", 3]\n', 5, "[alerts].command", "3 is not a string", "in quotes"),
    (ALERTS + 'command = ["", "x"]\n', 5, "[alerts].command", "'' is not a program", "start with the program"),
    (ALERTS + 'command = ["-x"]\n', 5, "[alerts].command", "'-x' is not a program", "start with the program"),
    (ALERTS + 'command = ["curl", "-d", "{mesage}"]\n', 5, "[alerts].command",
     "unknown placeholder '{mesage}' in '{mesage}'", "{message}"),
    (ALERTS + 'command = ["curl", "{message!r}"]\n', 5, "[alerts].command", "may not have a format", "{name}"),
    (ALERTS + 'command = ["curl", "{message"]\n', 5, "[alerts].command", "argument '{message'", "{{ and }}"),
    (ALERTS + 'command = ["{node}.sh"]\n', 5, "[alerts].command", "holds a placeholder", "name the program"),
    (ALERTS + 'command = ["a\\u0000b"]\n', 5, "[alerts].command", "holds a NUL", "remove it"),
    (ALERTS + 'command_timeout = 0\n', 5, "[alerts].command_timeout", "from 1 to 3600 seconds", "in that range"),
]


@pytest.mark.parametrize("text, line, key, problem, hint", BAD_INPUTS,
                         ids=[f"{i:02d}-{case[2]}" for i, case in enumerate(BAD_INPUTS)])
def test_bad_input_gives_one_located_line(text, line, key, problem, hint):
    with pytest.raises(ConfigError) as err:
        parse_cluster(text, "home.toml")
    error = err.value
    message = str(error)
    assert "\n" not in message
    assert (error.line, error.key) == (line, key)
    assert message.startswith(f"home.toml:{line}: " if line else "home.toml: ")
    assert f": {key}: " in message
    assert problem in error.problem
    assert hint in error.hint


def test_there_are_at_least_twenty_distinct_bad_inputs():
    assert len({case[0] for case in BAD_INPUTS}) >= 20


def test_workers_per_node_takes_per_gpu_and_share_gpus_a_boolean(tmp_path):
    base = '[[nodes]]\nname = "a"\nhost = "10.0.0.1"\n[jobs.t]\n'
    path = tmp_path / "cluster.toml"
    path.write_text(base + 'workers_per_node = "per-gpu"\nshare_gpus = true\n')
    job = load_cluster(path).jobs["t"]
    assert job.workers_per_node == "per-gpu" and job.share_gpus and job.most_workers_per_node == 16
    for wrong, said in (('"per-node"', "unknown layout 'per-node'"), ("0", "must be from 1 to 64"),
                        ("1.5", "expected an integer")):
        path.write_text(base + f"workers_per_node = {wrong}\n")
        with pytest.raises(ConfigError, match=said):
            load_cluster(path)
    path.write_text(base + 'share_gpus = "yes"\n')
    with pytest.raises(ConfigError, match="expected true or false"):
        load_cluster(path)
    path.write_text(base + 'workers_per_node = "per-gpu"\nport = 65530\n')
    with pytest.raises(ConfigError, match="use a port of at most 65520"):
        load_cluster(path)


def test_repository_example_has_every_alert_on():
    alerts = load_cluster(REPO / "cluster.toml").alerts
    assert alerts.enabled and alerts.command[0] == "notify-send"
    assert (alerts.gpu_temperature, alerts.gpu_memory_percent, alerts.node_offline_seconds) == (85, 95, 60)
    assert alerts.job_failed and alerts.job_stalled and alerts.straggler and alerts.job_succeeded and alerts.queued_runs


def test_init_writes_alerts_commented_out_ready_to_enable(tmp_path):
    text = cluster_to_toml(starter_cluster())
    assert parse_cluster(text).alerts == AlertRules()  # off until the user says
    example = [line for line in text.splitlines() if line.startswith("# ") and "=" in line
               and line.split("=")[0][2:].strip() in ("gpu_temperature", "node_offline_seconds", "job_failed",
                                                       "queued_runs", "command_timeout")]
    ntfy = next(line for line in text.splitlines() if "ntfy.sh" in line)
    enabled = text + "\n[alerts]\n" + "\n".join(line[2:] for line in [*example, ntfy]) + "\n"
    alerts = parse_cluster(enabled).alerts
    assert alerts.gpu_temperature == 85 and alerts.job_failed and alerts.command[:2] == ("curl", "-s")
    assert alerts.queued_runs and not alerts.job_stalled


def test_check_shows_the_alert_rules_and_whether_the_command_is_found(tmp_path, capsys):
    from homegpu.tui.cli.main import main

    path = tmp_path / "cluster.toml"
    path.write_text(NODE + '[alerts]\ngpu_temperature = 85\njob_failed = true\nqueued_runs = true\n'
                           f'command = ["{tmp_path}/nope", "{{message}}"]\n')
    assert main(["--config", str(path), "check"]) == 0
    out = capsys.readouterr().out
    assert "Alerts: GPU at 85 °C or more, job failed, queued runs\n" in out
    assert f"command: {tmp_path}/nope '{{message}}'  (not found: {tmp_path}/nope is not on this machine's PATH)" in out
    path.write_text(NODE)
    assert main(["--config", str(path), "check"]) == 0
    assert "Alerts: none" in capsys.readouterr().out


def test_the_references_alert_examples_are_valid():
    import re

    reference = (REPO / "docs" / "reference.md").read_text(encoding="utf-8")
    section = reference[reference.index("## `[alerts]`"):reference.index("## Mixed clusters")]
    blocks = re.findall(r"```toml\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    commands = [parse_cluster(NODE + block).alerts.command[0] for block in blocks]
    assert commands == ["notify-send", "curl"]


@pytest.mark.parametrize("toml, hint", [
    (JOB + 'min_workers = "two"\n', "write it like min_workers = 2"),  # the key's own example, not 22 for all
    (JOB + 'epochs = "ten"\n', "write it like epochs = 10"),
    (ALERTS + 'gpu_temperature = "hot"\n', "write it like gpu_temperature = 85"),  # a whole number's example for a float
    (NODE + 'port = "x"\n', "write it like port = 2222"),
])
def test_a_type_error_shows_the_keys_own_example(toml, hint):
    with pytest.raises(ConfigError) as err:
        parse_cluster(toml, "home.toml")
    assert err.value.hint.startswith(hint), err.value.hint


@pytest.mark.parametrize("script, code_dir", [("model/train.py", "model"), ("model/sub/train.py", "model/"),
                                              ("train.py", "."), ("./model/train.py", "model")])
def test_a_script_inside_its_code_dir_is_taken(script, code_dir):
    job = parse_cluster(JOB + f'script = "{script}"\ncode_dir = "{code_dir}"\n', "home.toml").jobs["train"]
    assert (job.script, job.code_dir) == (script, code_dir)
