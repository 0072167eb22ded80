"""Real Python output of a script error whose message is hundreds of lines, for the tests of tracebacks.

Each worker's code lies in its own folder, as on its own node: its traceback names other absolute
paths. The user's code (train.py calling src/model.py) calls a library in a site-packages folder,
which raises a ValueError shaped like Keras 3's under MultiWorkerMirroredStrategy: a PerReplica
dump of VALUES lines holding the worker's own values. Then, as TensorFlow does, a log line at exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

VALUES = 300
RAISED_AT = "src/model.py:6"  # the user's last frame (the library raises below it)

_TRAIN = """\
import atexit
import os
import sys
# As TensorFlow does after an error: a log line at exit, after the traceback, stamped differently on each node.
atexit.register(lambda: print(f"2025-01-02 10:00:00.{os.environ['WORKER']:>06}: W tensorflow/core/kernels/data/"
                              "generator_dataset_op.cc:108] Error occurred when finalizing GeneratorDataset "
                              "iterator: FAILED_PRECONDITION: Python interpreter state is not initialized."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "site-packages"))
from src.model import build
print("building the model", flush=True)
build(int(os.environ["WORKER"]), os.environ.get("PLACE", ""))
"""

_MODEL = """\
import fakelib
def build(worker, place):
    if place == "elsewhere":
        fakelib.convert(worker, {values})
    else:
        fakelib.convert(worker, {values})
"""

_LIBRARY = """\
def convert(worker, count):
    values = "\\n".join(f"  {i}: <tf.Tensor: shape=(), dtype=float32, numpy={worker * 1000 + i}.0>"
                        for i in range(count))
    raise ValueError("Attempt to convert a value (PerReplica:{\\n" + values + "\\n}) with an unsupported type "
                     "(<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.")
"""


def per_replica_error(folder: Path, worker: int, values: int = VALUES, place: str = "") -> tuple[str, tuple[str, ...]]:
    """Run the script as worker `worker` in folder/node{worker}; (its code dir, its output lines).
    `place="elsewhere"` raises the same error from another line of the user's code."""
    node = folder / f"node{worker}"
    code, library = node / "code", node / "site-packages" / "fakelib"
    (code / "src").mkdir(parents=True, exist_ok=True)
    library.mkdir(parents=True, exist_ok=True)
    (code / "train.py").write_text(_TRAIN)
    (code / "src" / "__init__.py").write_text("")
    (code / "src" / "model.py").write_text(_MODEL.format(values=values))
    (library / "__init__.py").write_text(textwrap.dedent(_LIBRARY))
    result = subprocess.run([sys.executable, str(code / "train.py")], cwd=node, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=60,
                            env={**os.environ, "WORKER": str(worker), "PLACE": place})
    assert result.returncode == 1, result.stdout
    return str(code.resolve()), tuple(result.stdout.splitlines())
