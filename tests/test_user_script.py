"""A user's script started through trainer/user_script.py, as every worker starts it: it must see what
`python SCRIPT ARGS` gives it, with homegpu's settings applied before it runs (real TensorFlow and tf-keras).

The bootstrap runs from a copy of homegpu/trainer in a `_homegpu/` folder, as code sync ships it to a node.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import homegpu.trainer

TWO_WORKERS = json.dumps({"cluster": {"worker": ["127.0.0.1:23901", "127.0.0.1:23902"]},
                          "task": {"type": "worker", "index": 0}})

WHAT_IT_SEES = """
import json, os, sys
print(json.dumps({"name": __name__, "file": __file__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                  "ours_on_path": any(p.endswith("_homegpu") for p in sys.path),
                  "pythonpath": os.environ.get("PYTHONPATH"), "tf_imported": "tensorflow" in sys.modules}))
def fail(n):
    raise ValueError(f"boom {n}")
if sys.argv[1] == "raise":
    fail(1)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """A node's code dir: the job's script under code/, homegpu's trainer under code/_homegpu/."""
    root = tmp_path_factory.mktemp("node")
    shutil.copytree(Path(homegpu.trainer.__file__).parent, root / "code/_homegpu/homegpu/trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "out").mkdir()
    return root


def start(shipped: Path, source: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run `source` as the job's script through the bootstrap, as launch_plan's command line does."""
    script = shipped / "code/train.py"
    script.write_text(source)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "HOMEGPU_", "PYTHONPATH"))}
    return subprocess.run([sys.executable, "-m", "homegpu.trainer.user_script", str(script), *args],
                          cwd=shipped / "out", capture_output=True, text=True, timeout=240,
                          env={**base, "PYTHONPATH": f"{shipped}/code/_homegpu:/opt/theirs", "TF_USE_LEGACY_KERAS": "1",
                               **env})


def test_the_script_sees_what_python_script_args_gives_it(shipped):
    result = start(shipped, WHAT_IT_SEES, "3", "--lr=0.1")
    assert result.returncode == 3, result.stderr
    seen = json.loads(result.stdout)
    script = str(shipped / "code/train.py")
    assert seen == {"name": "__main__", "file": script, "argv": [script, "3", "--lr=0.1"],
                    "path0": str(shipped / "code"), "cwd": str(shipped / "out"), "ours_on_path": False,
                    "pythonpath": "/opt/theirs", "tf_imported": False}


def test_a_scripts_exception_exits_1_with_a_traceback_from_its_own_code(shipped):
    result = start(shipped, WHAT_IT_SEES, "raise", TF_CONFIG=TWO_WORKERS)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[1].startswith(f'  File "{shipped}/code/train.py", line 9, in <module>'), lines
    assert "runpy" not in result.stderr and "user_script" not in result.stderr
    assert lines[-1] == "ValueError: boom 1"
    assert json.loads(result.stdout)["tf_imported"] is False  # whatever it sets before `import tensorflow` counts


def test_a_multi_worker_script_gets_the_patient_heartbeat_once_it_imports_tensorflow(shipped, tensorflow):
    source = """
import tensorflow as tf
from tensorflow.python.eager import context
config = context.context().coordination_service
print(config.heartbeat_timeout_in_ms if config else "none")
"""
    result = start(shipped, source, TF_CONFIG=TWO_WORKERS, HOMEGPU_PEER_TIMEOUT="90")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["90000"]
    alone = start(shipped, source)  # one worker: TensorFlow's defaults, nothing configured
    assert alone.stdout.split() == ["none"], alone.stderr[-2000:]


def test_keras_is_tf_keras_when_the_job_says_so(shipped, tensorflow):
    source = """
import keras
from keras import layers
import keras.callbacks
import tf_keras
model = keras.Sequential([keras.Input((3,)), layers.Dense(2)])
print(keras.__version__ == tf_keras.__version__, layers.Dense is tf_keras.layers.Dense,
      keras.callbacks is tf_keras.callbacks, type(model).__module__.startswith("tf_keras"))
keras.ops.add(1, 2)
"""
    result = start(shipped, source, HOMEGPU_KERAS="tf-keras")
    assert result.stdout.split() == ["True"] * 4, result.stderr[-2000:]
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        "AttributeError: keras.ops is Keras 3-only: this job runs tf-keras")
    plain = start(shipped, "import keras; print(keras.__version__.split('.')[0])")
    assert plain.stdout.strip() == "3", plain.stderr[-2000:]  # without the choice: the python's own Keras 3
