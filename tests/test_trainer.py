"""The built-in trainer (`python -m homegpu.trainer`): pure parts table-tested, then real
TensorFlow runs: two local workers under MultiWorkerMirroredStrategy, a killed worker resumed
from its backup, npz and image-folder data, and a tutorial-style user script.

Workers are real processes on 127.0.0.1 with their own TF_CONFIG; every test kills what it
started in a finally block. TensorFlow and tf-keras must be installed (the `tensorflow` extra);
without them these tests fail rather than skip.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from homegpu.trainer.cli import DataSpec, build_parser, parse_collective, parse_data_spec
from homegpu.trainer.cluster import SINGLE, ClusterConfigError, WorkerRole, worker_role
from homegpu.trainer.metrics import PREFIX, format_metric, parse_metric_line

TRAINER_DIR = Path(__file__).resolve().parents[1] / "trainer"
TUTORIAL = Path(__file__).parent / "fixtures" / "trainer" / "tutorial_script.py"
RUN_TIMEOUT = 240.0  # per worker process; a healthy run here takes 5-30 s


# -- metric lines ------------------------------------------------------------------------------

def test_format_then_parse_round_trips_with_event_first():
    line = format_metric(loss=0.5, event="epoch", epoch=1, worker=0, nested={"a": [1, 2]})
    assert line.startswith(PREFIX + '{"event":"epoch"')
    assert "\n" not in line
    assert parse_metric_line(line) == {"event": "epoch", "loss": 0.5, "epoch": 1, "worker": 0,
                                       "nested": {"a": [1, 2]}}


def test_format_sends_non_finite_numbers_as_null():
    line = format_metric(event="step", loss=math.nan, accuracy=math.inf, ok=1.5)
    assert parse_metric_line(line) == {"event": "step", "loss": None, "accuracy": None, "ok": 1.5}


def test_format_unwraps_numpy_scalars(tensorflow):
    import numpy as np
    data = parse_metric_line(format_metric(event="epoch", loss=np.float32(0.25), step=np.int64(3),
                                           bad=np.float64("nan")))
    assert data == {"event": "epoch", "loss": 0.25, "step": 3, "bad": None}


@pytest.mark.parametrize("fields", [{}, {"event": ""}, {"event": 3}])
def test_format_requires_an_event_name(fields):
    with pytest.raises(ValueError):
        format_metric(**fields)


@pytest.mark.parametrize("line, expected", [
    ('HOMEGPU_METRIC {"event":"epoch","epoch":2}\n', {"event": "epoch", "epoch": 2}),
    ('   HOMEGPU_METRIC {"event":"start"}', {"event": "start"}),
    ('12/96 [==>....] - loss: 0.3\rHOMEGPU_METRIC {"event":"step"}', {"event": "step"}),
    ('HOMEGPU_METRIC {"event":"end","loss":NaN}', {"event": "end", "loss": math.nan}),
])
def test_parse_accepts_metric_lines(line, expected):
    data = parse_metric_line(line)
    assert data is not None and data.keys() == expected.keys()
    assert data["event"] == expected["event"]


@pytest.mark.parametrize("line", [
    "",
    "Epoch 1/2",
    "HOMEGPU_METRIC",
    "HOMEGPU_METRIC ",
    'HOMEGPU_METRIC{"event":"epoch"}',                 # no space after the prefix
    'homegpu_metric {"event":"epoch"}',                # wrong case
    'log: HOMEGPU_METRIC {"event":"epoch"}',           # not at the start of the line
    'HOMEGPU_METRIC {"event":"epoch"',                 # truncated
    'HOMEGPU_METRIC {"event":"epoch"} trailing',       # more than one JSON value
    'HOMEGPU_METRIC ["event","epoch"]',                # not an object
    'HOMEGPU_METRIC {"loss":1.0}',                     # no event
    'HOMEGPU_METRIC {"event":""}',                     # empty event
    'HOMEGPU_METRIC {"event":7}',                      # event not a string
    'HOMEGPU_METRIC "epoch"',
    None,
    b'HOMEGPU_METRIC {"event":"epoch"}',
])
def test_parse_rejects_everything_else(line):
    assert parse_metric_line(line) is None


# -- TF_CONFIG roles ---------------------------------------------------------------------------

def _tf_config(workers: int, index: int, task_type: str = "worker", chief: int = 0) -> dict[str, str]:
    cluster = {"worker": [f"127.0.0.1:{20000 + i}" for i in range(workers)]}
    if chief:
        cluster["chief"] = ["127.0.0.1:19999"]
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}


@pytest.mark.parametrize("env, role", [
    ({}, SINGLE),
    ({"TF_CONFIG": "  "}, SINGLE),
    ({"TF_CONFIG": "{}"}, SINGLE),
    (_tf_config(2, 0), WorkerRole("worker", 0, 0, 2)),
    (_tf_config(3, 2), WorkerRole("worker", 2, 2, 3)),
    (_tf_config(2, 0, "chief", chief=1), WorkerRole("chief", 0, 0, 3)),
    (_tf_config(2, 1, chief=1), WorkerRole("worker", 1, 2, 3)),
])
def test_worker_role_from_tf_config(env, role):
    assert worker_role(env) == role
    assert role.is_chief == (role.rank == 0)


@pytest.mark.parametrize("text, fragment", [
    ("not json", "not valid JSON"),
    ("[1]", "JSON object"),
    ('{"cluster":{"worker":"a:1"},"task":{"type":"worker","index":0}}', "list of"),
    ('{"cluster":{"worker":["a:1"]},"task":{"type":"ps","index":0}}', "not supported"),
    ('{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":1}}', "not in the cluster"),
    ('{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":"0"}}', "not an integer"),
    ('{"cluster":{"worker":["a:1"],"chief":["b:1","c:1"]},"task":{"type":"worker","index":0}}', "more than one chief"),
])
def test_worker_role_rejects_bad_tf_config(text, fragment):
    with pytest.raises(ClusterConfigError, match=fragment):
        worker_role({"TF_CONFIG": text})


# -- options -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, spec", [
    ("synthetic", DataSpec("synthetic")),
    ("npz:/data/mnist.npz", DataSpec("npz", "/data/mnist.npz")),
    ("dir:relative/images", DataSpec("dir", "relative/images")),
    ("dir:C:/odd:path", DataSpec("dir", "C:/odd:path")),
])
def test_data_spec(text, spec):
    assert parse_data_spec(text) == spec
    assert str(spec) == text


@pytest.mark.parametrize("argv", [
    ["--data", "mnist"], ["--data", "npz:"], ["--model", "vgg"], ["--epochs", "0"],
    ["--batch-size", "0"], ["--learning-rate", "0"], ["--log-every", "-1"], ["--image-size", "4"],
])
def test_bad_options_exit_2_without_loading_tensorflow(argv):
    result = subprocess.run([sys.executable, "-m", "homegpu.trainer", *argv], capture_output=True,
                            text=True, timeout=60, env=_env())
    assert result.returncode == 2, result.stderr
    assert "usage:" in result.stderr
    assert "tensorflow" not in result.stderr.lower()


@pytest.mark.parametrize("text, collective", [("NCCL", "NCCL"), ("ring", "RING"), (" Auto ", "AUTO")])
def test_parse_collective(text, collective):
    assert parse_collective(text) == collective


@pytest.mark.parametrize("argv, env, fragment", [
    (["--collective", "mpi"], {}, "'mpi': use AUTO, RING, NCCL"),
    ([], {"HOMEGPU_COLLECTIVE": "gloo"}, "'gloo': use AUTO, RING, NCCL (--collective or $HOMEGPU_COLLECTIVE)"),
])
def test_bad_collective_exits_2_without_loading_tensorflow(argv, env, fragment):
    result = subprocess.run([sys.executable, "-m", "homegpu.trainer", *argv], capture_output=True,
                            text=True, timeout=60, env=_env(**env))
    assert result.returncode == 2 and fragment in result.stderr, result.stderr
    assert "tensorflow" not in result.stderr.lower()


def test_collective_option_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("HOMEGPU_COLLECTIVE", "ring")
    assert build_parser().parse_args([]).collective == "RING"
    assert build_parser().parse_args(["--collective", "NCCL"]).collective == "NCCL"
    monkeypatch.delenv("HOMEGPU_COLLECTIVE")
    assert build_parser().parse_args([]).collective == "AUTO"


def test_defaults_and_help():
    args = build_parser().parse_args([])
    assert (args.data, args.model, args.epochs, args.batch_size, args.steps_per_epoch) == \
        (DataSpec("synthetic"), "cnn", 2, 64, 0)
    text = build_parser().format_help()
    for option in ("--data", "--model", "--epochs", "--batch-size", "--steps-per-epoch", "--output",
                   "--log-every", "--seed", "--learning-rate", "--image-size", "--collective"):
        assert option in text


# -- the trainer imports nothing it cannot have on a node ---------------------------------------

ALLOWED_TOP = {"tensorflow", "tf_keras", "numpy", "homegpu"}
TORCH_ALLOWED_TOP = {"torch", "homegpu"}
TF_FREE = ("metrics.py", "cluster.py", "synthetic.py", "cli.py", "__main__.py", "shares.py", "import_hooks.py",
           "memory_cap.py")
TORCH_FILES = ("torch_demo.py", "balance_torch.py")  # PyTorch's demo and its balancing: no TensorFlow
JAX_ALLOWED_TOP = {"jax", "numpy", "homegpu"}
JAX_FILES = ("jax_demo.py", "jax_cluster.py")  # JAX's demo and its cluster environment: no TensorFlow
# each framework held to a GPU budget once the script imports it: any of the three, never at load
BUDGET_FILES = ("gpu_budget.py",)
BUDGET_ALLOWED_TOP = {"tensorflow", "torch", "jax", "pynvml", "homegpu"}  # pynvml: a card's memory, where it imports


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) for every import in the file."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module or "", id(node) in top_level))
    return found


@pytest.mark.parametrize("path", sorted(TRAINER_DIR.glob("*.py")), ids=lambda p: p.name)
def test_trainer_imports_only_stdlib_tensorflow_and_itself(path):
    """(TORCH_FILES: the standard library, torch and itself; JAX_FILES: jax, numpy and itself; BUDGET_FILES: any
    framework, and pynvml, inside functions only.)"""
    allowed = TORCH_ALLOWED_TOP if path.name in TORCH_FILES else JAX_ALLOWED_TOP if path.name in JAX_FILES \
        else BUDGET_ALLOWED_TOP if path.name in BUDGET_FILES else ALLOWED_TOP
    for module, at_top in _imports(path):
        top = module.split(".")[0]
        if path.name in BUDGET_FILES and at_top:
            assert top in sys.stdlib_module_names or top == "homegpu", f"{path.name} must not import {module} at load"
        assert top in sys.stdlib_module_names or top in allowed, f"{path.name} imports {module}"
        if top == "homegpu":
            assert module.startswith("homegpu.trainer"), f"{path.name} imports {module}"
        if path.name in TF_FREE and at_top:
            assert top not in ("tensorflow", "tf_keras"), f"{path.name} must not import {module} at load"
        if path.name == "metrics.py":
            assert top in sys.stdlib_module_names, f"metrics.py must stay standard library only: {module}"


JAX_AFTER_TENSORFLOW = ("import sys\nfrom homegpu.trainer.cli import leave_jax_out\n{leave}\nimport tensorflow\n"
                        "print(sys.modules.get('jax') is not None)\n")


@pytest.mark.parametrize("leave, imported", [("", "True"), ("leave_jax_out()", "False")])
def test_the_trainer_leaves_jax_out_of_tensorflows_import(tensorflow, jax, leave, imported):
    """With JAX installed beside it (this venv has it for the JAX jobs), TensorFlow's import loads it too; the
    trainer marks it absent before, and TensorFlow imports without it."""
    result = subprocess.run([sys.executable, "-c", JAX_AFTER_TENSORFLOW.format(leave=leave)], capture_output=True,
                            text=True, timeout=300, env=_env())
    assert result.returncode == 0 and result.stdout.strip() == imported, result.stdout + result.stderr[-2000:]


# -- synthetic data ----------------------------------------------------------------------------

def test_synthetic_images_shapes_and_balance(tensorflow):
    from homegpu.trainer.synthetic import make_images

    images, labels = make_images(1000, seed=3)
    assert images.shape == (1000, 32, 32, 3) and images.dtype.name == "uint8"
    assert labels.shape == (1000,) and labels.dtype.name == "int64"
    counts = [int((labels == c).sum()) for c in range(10)]
    assert counts == [100] * 10
    assert 60 < images.mean() < 200 and images.std() > 30  # neither blank nor saturated
    small, _ = make_images(10, image_size=16, seed=3)
    assert small.shape == (10, 16, 16, 3)


def test_synthetic_images_are_deterministic_per_seed(tensorflow):
    from homegpu.trainer.synthetic import make_images

    a_images, a_labels = make_images(200, seed=7)
    b_images, b_labels = make_images(200, seed=7)
    c_images, _ = make_images(200, seed=8)
    assert (a_images == b_images).all() and (a_labels == b_labels).all()
    assert (a_images != c_images).any()


def test_synthetic_classes_are_learnable(tensorflow):
    import numpy as np

    from homegpu.trainer.synthetic import make_images, nearest_mean_accuracy

    train = make_images(2000, seed=1)
    test = make_images(500, seed=2)
    means = np.stack([train[0][train[1] == c].astype(np.float32).mean(axis=0) for c in range(10)])
    distances = [np.abs(means[a] - means[b]).mean() for a in range(10) for b in range(a + 1, 10)]
    assert min(distances) > 5, "two classes have nearly the same mean image"
    # Raw-pixel nearest class mean, no training at all: far above chance (0.1).
    assert nearest_mean_accuracy(train, test) > 0.6


@pytest.mark.parametrize("kwargs", [{"count": 0}, {"count": 5, "image_size": 4}, {"count": 5, "num_classes": 1}])
def test_synthetic_rejects_bad_sizes(tensorflow, kwargs):
    from homegpu.trainer.synthetic import make_images

    with pytest.raises(ValueError):
        make_images(**kwargs)


# -- running workers ---------------------------------------------------------------------------

def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "HOMEGPU_OUTPUT_DIR", "HOMEGPU_COLLECTIVE")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    return env


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _cluster_env(ports: list[int], index: int, **extra: str) -> dict[str, str]:
    config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": index}}
    return _env(TF_CONFIG=json.dumps(config), **extra)


class Worker:
    """One trainer (or script) process: stdout lines collected by a thread, stderr to a file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> None:
        self.log = log
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        with open(log, "ab") as stderr:
            self.process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=stderr,
                                            text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            self._new.put(line)
        self._new.put(None)

    @property
    def metrics(self) -> list[dict]:
        return [m for m in map(parse_metric_line, list(self.lines)) if m is not None]

    def events(self, event: str) -> list[dict]:
        return [m for m in self.metrics if m["event"] == event]

    def wait_for_metric(self, match, timeout: float = RUN_TIMEOUT) -> dict:
        """The first metric line (already seen or coming) for which match(metric) is true."""
        for metric in self.metrics:
            if match(metric):
                return metric
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._new.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            metric = parse_metric_line(line)
            if metric is not None and match(metric):
                return metric
        raise AssertionError(f"no such metric line; exit {self.process.poll()}\n{self.output()}")

    def wait(self, timeout: float = RUN_TIMEOUT) -> int:
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: takes any children too
        self.process.wait(timeout=30)
        self._reader.join(timeout=10)

    def output(self) -> str:
        stderr = self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""
        return "stdout:\n" + "\n".join(self.lines[-40:]) + "\nstderr (end):\n" + stderr


class Workers:
    """Starts workers and kills every one still running on exit, whatever happened."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.started = tmp, []

    def start(self, argv: list[str], env: dict[str, str], name: str, cwd: Path | None = None) -> Worker:
        worker = Worker(argv, env, self.tmp / f"{name}.stderr.log", cwd=cwd)
        self.started.append(worker)
        return worker

    def trainer(self, ports: list[int], index: int, output: Path, *args: str, name: str = "",
                env: dict[str, str] | None = None) -> Worker:
        argv = [sys.executable, "-m", "homegpu.trainer", "--output", str(output), *args]
        return self.start(argv, _cluster_env(ports, index, **(env or {})), name or f"worker{index}")

    def finish_all(self, workers: list[Worker], timeout: float = RUN_TIMEOUT) -> list[int]:
        codes = [w.wait(timeout) for w in workers]
        for worker, code in zip(workers, codes):
            assert code == 0, f"worker exited {code}\n{worker.output()}"
        return codes

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc_info) -> None:
        for worker in self.started:
            worker.kill()


def _single(workers: Workers, output: Path, *args: str, name: str = "single") -> Worker:
    argv = [sys.executable, "-m", "homegpu.trainer", "--output", str(output), *args]
    return workers.start(argv, _env(), name)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def _top_level(root: Path) -> set[str]:
    return {p.name for p in root.iterdir()} if root.exists() else set()


def test_two_workers_train_the_synthetic_set(tensorflow, tmp_path):
    """Under the RING collective, as homegpu's device plan gives a job with a CPU worker."""
    ports = _free_ports(2)
    out = [tmp_path / "out0", tmp_path / "out1"]
    args = ("--epochs", "2", "--log-every", "8", "--seed", "1")
    with Workers(tmp_path) as workers:
        team = [workers.trainer(ports, i, out[i], *args, env={"HOMEGPU_COLLECTIVE": "RING"}) for i in range(2)]
        workers.finish_all(team)

    for index, worker in enumerate(team):
        assert all(m["worker"] == index and m["workers"] == 2 for m in worker.metrics)
        start, = worker.events("start")
        assert (start["initial_epoch"], start["resumed"], start["epochs"]) == (0, False, 2)
        assert (start["batch_size"], start["global_batch_size"], start["data"]) == (64, 128, "synthetic")
        # What the strategy was built with, read back from it: the collective the worker was given.
        assert (start["collective"], start["replicas"]) == ("RING", 2)
        assert start["params"] == team[0].events("start")[0]["params"] > 1000  # the same model everywhere
        epochs = worker.events("epoch")
        assert [m["epoch"] for m in epochs] == [1, 2]
        assert all(m["examples_per_sec"] > 0 and m["seconds"] > 0 for m in epochs)
        end, = worker.events("end")
        assert end["epoch"] == 2 and end["accuracy"] >= 0.6 and end["val_accuracy"] >= 0.6
        # Step lines are global running means: the last step of an epoch equals the epoch's value.
        steps = start["steps_per_epoch"]
        last_step = [m for m in worker.events("step") if m["epoch"] == 2 and m["step"] == steps]
        assert last_step and abs(last_step[0]["accuracy"] - epochs[1]["accuracy"]) < 1e-3
        assert all(0 <= m["accuracy"] <= 1 for m in worker.events("step"))
    # Metrics are global, so both workers report the same loss and accuracy.
    assert team[0].events("epoch")[-1]["loss"] == pytest.approx(team[1].events("epoch")[-1]["loss"])

    chief_files = _files(out[0])
    assert "model/saved_model.pb" in chief_files and "checkpoints/last.weights.h5" in chief_files
    assert team[0].events("end")[0]["model_dir"] == str(out[0] / "model")
    assert ("tensorboard" in chief_files) == (importlib.util.find_spec("tensorboard") is not None)
    assert "DONE" in chief_files and "backup/chief/checkpoint" in chief_files  # kept for the controller
    assert _top_level(out[1]) == {"DONE", "backup"}, f"worker 1 left other files: {_files(out[1])}"

    _assert_saved_model_classifies(out[0] / "model")


def _assert_saved_model_classifies(model_dir: Path) -> None:
    """Load the chief's model in a fresh process and score it on unseen synthetic images."""
    script = (
        "import os, sys; os.environ['TF_USE_LEGACY_KERAS'] = '1'\n"
        "import tf_keras as keras\n"
        "from homegpu.trainer.synthetic import make_images\n"
        "x, y = make_images(500, seed=12345)\n"
        "model = keras.models.load_model(sys.argv[1])\n"
        "print('accuracy', float((model.predict(x.astype('float32'), verbose=0).argmax(1) == y).mean()))\n")
    result = subprocess.run([sys.executable, "-c", script, str(model_dir)], capture_output=True, text=True,
                            timeout=RUN_TIMEOUT, env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(result.stdout.split("accuracy")[-1])
    assert accuracy >= 0.6, result.stdout


def test_killed_worker_resumes_from_its_backup(tensorflow, tmp_path):
    ports = _free_ports(2)
    out = [tmp_path / "out0", tmp_path / "out1"]
    args = ("--epochs", "3", "--log-every", "4", "--samples", "3072")
    with Workers(tmp_path) as workers:
        first = [workers.trainer(ports, i, out[i], *args, name=f"first{i}") for i in range(2)]
        for worker in first:  # both backed up epoch 1 (backup runs before the epoch line)...
            worker.wait_for_metric(lambda m: m["event"] == "epoch" and m["epoch"] == 1)
        first[1].wait_for_metric(lambda m: m["event"] == "step" and m["epoch"] == 2)
        first[1].kill()  # ...then worker 1 dies during epoch 2; the orchestrator stops the chief
        first[0].kill()
        assert all(m["epoch"] < 3 for w in first for m in w.events("epoch"))
        assert (out[1] / "backup" / "chief" / "checkpoint").exists(), "worker 1 kept no backup"

        second = [workers.trainer(ports, i, out[i], *args, name=f"second{i}") for i in range(2)]
        workers.finish_all(second)

    for worker in second:
        start, = worker.events("start")
        assert start["initial_epoch"] >= 1 and start["resumed"] is True
        assert start["collective"] == "AUTO"  # nothing given: TensorFlow picks
        epochs = [m["epoch"] for m in worker.events("epoch")]
        assert epochs == list(range(start["initial_epoch"] + 1, 4))
        end, = worker.events("end")
        assert end["epoch"] == 3 and end["initial_epoch"] == start["initial_epoch"]
        assert end["accuracy"] >= 0.6
    assert "model/saved_model.pb" in _files(out[0])
    assert _top_level(out[1]) == {"DONE", "backup"}


def test_chief_killed_while_saving_resumes_at_the_last_epoch(tensorflow, tmp_path):
    """The chief dies while saving the final model: the restart resumes at the last epoch and only
    saves; one more restart after that finds every DONE marker and trains nothing."""
    ports = _free_ports(2)
    out = [tmp_path / "out0", tmp_path / "out1"]
    args = ("--epochs", "2", "--log-every", "0", "--samples", "1024")
    with Workers(tmp_path) as workers:
        first = [workers.trainer(ports, i, out[i], *args, name=f"first{i}") for i in range(2)]
        first[0].wait_for_metric(lambda m: m["event"] == "saving")
        first[0].kill()  # the chief, mid-save; then the orchestrator stops the other worker
        first[1].kill()
        assert [m["epoch"] for m in first[0].events("epoch")] == [1, 2] and not first[0].events("end")
        assert not (out[0] / "DONE").exists()

        second = [workers.trainer(ports, i, out[i], *args, name=f"second{i}") for i in range(2)]
        workers.finish_all(second)
        third = [workers.trainer(ports, i, out[i], *args, name=f"third{i}") for i in range(2)]
        workers.finish_all(third)

    for worker in second:
        start, = worker.events("start")
        assert (start["initial_epoch"], start["resumed"]) == (2, True), worker.output()
        assert worker.events("epoch") == [] and worker.events("step") == [], "epochs were trained again"
        saving, = worker.events("saving")
        end, = worker.events("end")
        assert (end["epoch"], end["initial_epoch"]) == (2, 2)
        assert end["loss"] == first[0].events("epoch")[-1]["loss"]  # the last epoch's, from before the crash
        assert "resumed at epoch 2 from the backup" in worker.log.read_text()
    assert second[0].events("end")[0]["model_dir"] == str(out[0] / "model")
    assert "model/saved_model.pb" in _files(out[0]) and (out[1] / "DONE").exists()
    for worker in third:
        assert worker.events("start") == [] and worker.events("saving") == []
        end, = worker.events("end")
        assert end["already_done"] is True and end["epoch"] == 2
        assert "already done" in worker.log.read_text()
    _assert_saved_model_classifies(out[0] / "model")


def test_workers_with_different_backups_refuse_to_resume(tensorflow, tmp_path):
    """A lost backup on one machine: both stop with status 3 and say so, instead of diverging."""
    ports = _free_ports(2)
    out = [tmp_path / "out0", tmp_path / "out1"]
    args = ("--epochs", "3", "--log-every", "0", "--samples", "1024")
    with Workers(tmp_path) as workers:
        first = [workers.trainer(ports, i, out[i], *args, name=f"first{i}") for i in range(2)]
        for worker in first:
            worker.wait_for_metric(lambda m: m["event"] == "epoch" and m["epoch"] == 1)
        for worker in reversed(first):
            worker.kill()
        shutil.rmtree(out[1] / "backup")  # as if worker 1's machine lost its disk

        second = [workers.trainer(ports, i, out[i], *args, name=f"second{i}") for i in range(2)]
        codes = [w.wait() for w in second]
    assert codes == [3, 3], "\n".join(w.output() for w in second)
    for worker in second:
        error, = worker.events("error")
        assert "backups hold different epochs" in error["message"] and error["status"] == 3


def _write_npz(path: Path, train: int, test: int) -> None:
    """mnist format: uint8 [n, 28, 28] images whose bright bar's row depends on the label."""
    import numpy as np

    rng = np.random.default_rng(0)

    def split(n):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for image, label in zip(images, labels):
            image[2 * label + 2:2 * label + 6, 4:24] = 250
        return images, labels

    (x_train, y_train), (x_test, y_test) = split(train), split(test)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def test_single_worker_trains_on_an_mnist_format_npz(tensorflow, tmp_path):
    _write_npz(tmp_path / "mnist.npz", 1536, 256)
    with Workers(tmp_path) as workers:
        worker = _single(workers, tmp_path / "out", "--data", f"npz:{tmp_path / 'mnist.npz'}", "--epochs", "1",
                         "--batch-size", "32")
        workers.finish_all([worker])
    start, = worker.events("start")
    assert (start["workers"], start["worker"], start["train_examples"], start["steps_per_epoch"]) == (1, 0, 1536, 48)
    assert start["validation_steps"] == 8
    end, = worker.events("end")
    assert end["epoch"] == 1 and end["accuracy"] > 0.3 and end["val_accuracy"] >= 0.6
    assert "model/saved_model.pb" in _files(tmp_path / "out")


def test_single_worker_trains_on_a_folder_of_png_and_jpeg_images(tensorflow, tmp_path):
    root = tmp_path / "images"
    script = (
        "import os, sys, numpy as np, tensorflow as tf\n"
        "root = sys.argv[1]; rng = np.random.default_rng(0)\n"
        "for label, name in enumerate(['circle', 'square', 'stripe']):\n"
        "    os.makedirs(os.path.join(root, name))\n"
        "    for i in range(16):\n"
        "        image = rng.integers(0, 80, (40, 48, 3)).astype(np.uint8)\n"
        "        image[:, 16 * label:16 * label + 16] = 230\n"
        "        encode = tf.io.encode_png if i % 2 else tf.io.encode_jpeg\n"
        "        tf.io.write_file(os.path.join(root, name, f'{i}.' + ('png' if i % 2 else 'jpg')), encode(image))\n"
        "open(os.path.join(root, 'circle', 'notes.txt'), 'w').write('not an image')\n")
    made = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, env=_env())
    assert made.returncode == 0, made.stderr[-3000:]

    with Workers(tmp_path) as workers:
        worker = _single(workers, tmp_path / "out", "--data", f"dir:{root}", "--epochs", "1", "--batch-size", "8",
                         "--image-size", "24")
        workers.finish_all([worker])
    start, = worker.events("start")
    assert (start["train_examples"], start["steps_per_epoch"], start["validation_steps"]) == (48, 6, 0)
    end, = worker.events("end")
    assert end["epoch"] == 1 and end["loss"] is not None
    assert "model/saved_model.pb" in _files(tmp_path / "out")


def test_missing_data_is_exit_2_with_an_error_line(tensorflow, tmp_path):
    with Workers(tmp_path) as workers:
        worker = _single(workers, tmp_path / "out", "--data", f"npz:{tmp_path / 'absent.npz'}")
        assert worker.wait() == 2
    error, = worker.events("error")
    assert "absent.npz" in error["message"] and error["status"] == 2


def test_models_build_for_color_and_grayscale(tensorflow):
    script = (
        "import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'\n"
        "from homegpu.trainer import MODELS, models\n"
        "for name in MODELS:\n"
        "    for shape in [(32, 32, 3), (28, 28, 1)]:\n"
        "        model = models.build(name, shape, 7)\n"
        "        print(name, shape, model.output_shape, model.count_params())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                            env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("(None, 7)") == 4
    assert "resnet (32, 32, 3)" in result.stdout


def test_tutorial_style_script_runs_with_two_workers(tensorflow, tmp_path):
    ports = _free_ports(2)
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    with Workers(tmp_path) as workers:
        team = []
        for index, cwd in enumerate(dirs):
            cwd.mkdir()
            team.append(workers.start([sys.executable, str(TUTORIAL)], _cluster_env(ports, index), f"tutorial{index}",
                                      cwd=cwd))
        workers.finish_all(team)
    assert any("tutorial script done, chief: True" in line for line in team[0].lines)
    assert any("tutorial script done, chief: False" in line for line in team[1].lines)
    assert (dirs[0] / "keras-model" / "saved_model.pb").exists()
    assert not (dirs[1] / "keras-model").exists() and not (dirs[1] / "workertemp_1").exists()
