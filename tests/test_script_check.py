"""Keras 3 under MultiWorkerMirroredStrategy is refused before launch, from the job's code read with `ast`."""

from __future__ import annotations

from pathlib import Path

import pytest

from homegpu.remote.config import JobSpec
from homegpu.remote.jobs.script_check import keras3_imports, keras3_problem

KERAS_IO_STYLE = '''import os
os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.layers.Dense(10)])
'''


@pytest.mark.parametrize("line, keras3", [
    ("import keras", True), ("import keras.layers", True), ("from keras import layers", True),
    ("from keras.layers import Dense", True), ("import os, keras as k", True),
    ("import tf_keras as keras", False), ("from tensorflow import keras", False), ("import tensorflow.keras", False),
    ("from . import keras", False), ("import keras_tuner", False), ("from tf_keras import layers", False),
])
def test_what_counts_as_importing_keras_3(line, keras3):
    imports, _ = keras3_imports(f"{line}\n")
    assert bool(imports) is keras3
    if keras3:
        assert imports[0][0] == 1 and "keras" in imports[0][1]


@pytest.mark.parametrize("source", [
    "tf.distribute.MultiWorkerMirroredStrategy()", "tf.distribute.experimental.MultiWorkerMirroredStrategy()",
    "from tensorflow.distribute import MultiWorkerMirroredStrategy", "S = MultiWorkerMirroredStrategy",
])
def test_every_way_of_naming_the_strategy_is_seen(source):
    assert keras3_imports(source)[1]
    assert not keras3_imports("tf.distribute.MirroredStrategy()")[1]


def write_job(tmp_path: Path, files: dict[str, str], **job) -> tuple[JobSpec, str]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return JobSpec(name="mnist", script=job.pop("script", "train.py"), **job), str(tmp_path / "cluster.toml")


def test_the_refusal_names_the_file_line_and_both_fixes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job, source = write_job(tmp_path, {"train.py": KERAS_IO_STYLE})
    problem = keras3_problem(job, source, workers=2)
    assert problem.startswith("train.py:4: `import keras` is Keras 3, which cannot train under "
                              "MultiWorkerMirroredStrategy")
    assert "import tf_keras as keras" in problem and 'keras = "tf-keras" in [jobs.mnist]' in problem
    assert 'framework = "jax" and keras.distribution.DataParallel' in problem  # Keras 3's own way across machines
    assert "\n" not in problem


def test_a_jax_job_with_keras_3_is_not_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job, source = write_job(tmp_path, {"train.py": KERAS_IO_STYLE}, framework="jax")
    assert keras3_problem(job, source, workers=2) == ""


def test_the_import_is_found_in_the_code_dirs_other_files(tmp_path, monkeypatch):
    """The script builds the strategy; a module beside it imports Keras 3: both ship, both count."""
    monkeypatch.chdir(tmp_path)
    job, source = write_job(tmp_path, {
        "proj/train.py": "import tensorflow as tf\nfrom model import build\ntf.distribute.MultiWorkerMirroredStrategy()\n",
        "proj/model.py": "\n\nfrom keras import layers\n", "proj/__pycache__/x.py": "import keras\n",
        "proj/broken.py": "def (:\n"}, script="proj/train.py", code_dir="proj")
    assert keras3_problem(job, source, workers=2).startswith("proj/model.py:3: `from keras import layers`")


@pytest.mark.parametrize("why_fine, files, job, workers", [
    ("one worker: Keras 3 trains under the strategy alone", {"train.py": KERAS_IO_STYLE}, {}, 1),
    ("the job runs tf-keras in its place", {"train.py": KERAS_IO_STYLE}, {"keras": "tf-keras"}, 2),
    ("tf-keras by its own name", {"train.py": KERAS_IO_STYLE.replace("import keras", "import tf_keras as keras")},
     {}, 2),
    ("no multi-worker strategy", {"train.py": "import keras\nkeras.Sequential()\n"}, {}, 2),
])
def test_what_is_not_refused(tmp_path, why_fine, files, job, workers):
    job, source = write_job(tmp_path, files, **job)
    assert keras3_problem(job, source, workers) == "", why_fine


def test_the_built_in_trainer_is_never_read(tmp_path):
    assert keras3_problem(JobSpec(name="demo"), str(tmp_path / "cluster.toml"), workers=4) == ""
