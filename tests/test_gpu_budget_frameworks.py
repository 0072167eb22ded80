"""A job's gpu_memory reaching the real frameworks, as far as a machine without a GPU can show it.

TensorFlow's logical device limit and PyTorch's per-process memory fraction act only on a GPU: here each test
checks that homegpu's hook runs when the script imports the framework and says there is no GPU to hold, and
that an out-of-memory error with nothing held blames no budget. JAX's limit is an environment variable read when
its backend starts, so a replayed nvidia-smi (a recorded RTX 2080 SUPER, 8192 MiB) gives the card's memory and
the test reads the fraction the script's JAX starts with. On a GPU machine the limits themselves are checked
by tests/device/gpu_budget.py (what it showed is in the closing notes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpu_replay import FIXTURES, write_replay_nvidia_smi
from helpers import homegpu, local_cluster_toml

from simcluster import free_job_port

GIB = 1024 ** 3


def run_script(tmp_path: Path, text: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`text` as a script started the way homegpu starts a worker's, with HOMEGPU_GPU_MEMORY = 5 GiB."""
    script = tmp_path / "train.py"
    script.write_text(text)
    return subprocess.run([sys.executable, "-m", "homegpu.trainer.user_script", str(script)], cwd=tmp_path,
                          env={**os.environ, "HOMEGPU_GPU_MEMORY": str(5 * GIB), **env}, capture_output=True,
                          text=True, timeout=300)


def test_a_pytorch_script_is_held_once_it_imports_torch(pytorch, tmp_path):
    done = run_script(tmp_path, "import torch\nprint('cuda', torch.cuda.is_available())\n", LOCAL_RANK="0")
    assert done.returncode == 0, done.stderr
    assert "homegpu: gpu_memory 5.0 GiB: no GPU here, nothing to hold" in done.stderr
    assert done.stdout == "cuda False\n"


def test_a_jax_script_starts_its_backend_with_the_budget_as_its_memory_fraction(jax, tmp_path):
    smi = write_replay_nvidia_smi(tmp_path / "bin", FIXTURES / "gpus_1x_rtx2080super_windows_load.csv", None)
    done = run_script(tmp_path, "import os\nimport jax\nprint(os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'])\n"
                                "print(jax.numpy.ones(3).sum())\n", PATH=f"{smi}:{os.environ['PATH']}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.6250", "3.0"]  # 5 GiB of the card's 8 GiB
    assert "homegpu: gpu_memory 5.0 GiB: JAX held to it on its GPU" in done.stderr


def test_a_jax_scripts_own_memory_fraction_wins(jax, tmp_path):
    smi = write_replay_nvidia_smi(tmp_path / "bin", FIXTURES / "gpus_1x_rtx2080super_windows_load.csv", None)
    done = run_script(tmp_path, "import os\nimport jax\nprint(os.environ['XLA_PYTHON_CLIENT_MEM_FRACTION'])\n",
                      PATH=f"{smi}:{os.environ['PATH']}", XLA_PYTHON_CLIENT_MEM_FRACTION="0.3")
    assert done.stdout == "0.3\n", done.stderr


def test_a_tensorflow_run_with_gpu_memory_is_held_and_its_oom_on_a_cpu_blames_no_budget(tensorflow, tmp_path):
    """A real run on this machine: the script's TensorFlow is held once imported (no GPU here, it says so), then
    runs out of memory for real (its CPU allocator's ResourceExhaustedError): the run fails with the known cause
    for the batch, not the budget, since a CPU was held to nothing."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("import tensorflow as tf\ntf.zeros([1 << 40])\n")
    job = (f'[jobs.mine]\nscript = "train.py"\npython = "{sys.executable}"\nport = {free_job_port()}\n'
           'gpu_memory = "5GiB"\nrestart = "never"\n')
    config = local_cluster_toml(code, jobs=job)
    plan = homegpu("--config", str(config), "tfconfig", "mine", cwd=code)
    assert "gpu_memory 5.0 GiB: no worker has a GPU, so nothing is held" in plan.stdout, plan.stdout + plan.stderr
    result = homegpu("--config", str(config), "run", "mine", "--no-tui", cwd=code, timeout=300)
    shown = result.stdout + result.stderr
    assert result.returncode != 0, shown
    (run_dir,) = (code / "experiments").iterdir()
    log = next(run_dir.glob("**/*.log")).read_text()
    assert log.count("homegpu: gpu_memory 5.0 GiB: no GPU here, nothing to hold") == 1, log
    assert "OOM when allocating tensor" in log and "held to the job's gpu_memory" not in log
    assert "the GPU ran out of memory; fix: use a smaller batch_size" in shown, shown[-3000:]
