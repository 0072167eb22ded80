"""A user's script written the way keras.io writes one today (`import keras`, MultiWorkerMirroredStrategy,
`fit` on tf.data), run on two machines of the test LAN with real TensorFlow, as a new user would.

Keras 3 cannot train under that strategy (keras-team/keras#20585): the run is refused before anything
starts, naming the line and both fixes; with keras = "tf-keras" in the job the same file trains unchanged.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


from helpers import homegpu, read_metrics, worker_processes
from simcluster import free_job_port


KERAS_IO_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "keras_io_mwms.py"
IMPORT_LINE = KERAS_IO_SCRIPT.read_text().splitlines().index("import keras  # noqa: E402") + 1


def keras_io_job(sim_cluster, tmp_path: Path, name: str = "mine", **job) -> Path:
    """cluster.toml with job `name`: the keras.io-style script in my_model/, on node1 and node2."""
    (tmp_path / "my_model").mkdir()
    shutil.copy(KERAS_IO_SCRIPT, tmp_path / "my_model" / "train.py")
    table = {"python": sys.executable, "script": "my_model/train.py", "nodes": ["node1", "node2"],
             "port": free_job_port(), "stall_timeout": 120.0, "max_restarts": 1, **job}
    return sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={name: table})


def test_a_keras_3_script_is_refused_before_anything_starts(sim_cluster, tmp_path):
    config = keras_io_job(sim_cluster, tmp_path, name="keras3")  # a name no other test's runs use on the nodes
    result = homegpu("--config", str(config), "run", "keras3", "--no-tui", cwd=tmp_path)
    print(result.stdout, result.stderr)  # what a user saw (pytest -s)
    assert result.returncode == 1, result.stdout + result.stderr
    (refusal,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert refusal.startswith(f"homegpu: keras3 not started: my_model/train.py:{IMPORT_LINE}: `import keras` is "
                              "Keras 3, which cannot train under MultiWorkerMirroredStrategy"), refusal
    assert "import tf_keras as keras" in refusal and 'keras = "tf-keras" in [jobs.keras3]' in refusal, refusal
    assert not worker_processes(sim_cluster)
    assert not (tmp_path / "experiments").exists()
    for name in ("node1", "node2"):  # nothing of this job shipped or started (other tests' runs share the nodes)
        work = sim_cluster.node(name).work_dir
        assert not (work / "code" / "keras3").exists() and not list(work.glob("runs/keras3-*")), \
            sorted(work.rglob("keras3*"))


def test_the_same_script_with_keras_tf_keras_trains_on_two_nodes_and_learns(sim_cluster, tmp_path):
    config = keras_io_job(sim_cluster, tmp_path, keras="tf-keras", args=["6"])
    result = homegpu("--config", str(config), "run", "mine", "--no-tui", cwd=tmp_path, timeout=400)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Number of devices: 2" in result.stdout and "generation 2" not in result.stdout
    (run_dir,) = (tmp_path / "experiments").iterdir()
    epochs = [m for m in read_metrics(run_dir) if m.get("event") == "epoch"]
    for worker in ("node1", "node2"):
        losses = [m["loss"] for m in sorted(epochs, key=lambda m: m["epoch"]) if m["worker_label"] == worker]
        assert len(losses) == 6, epochs
        assert losses[-1] < 0.8 * losses[0], f"{worker} did not learn: {losses}"
    assert not worker_processes(sim_cluster)
