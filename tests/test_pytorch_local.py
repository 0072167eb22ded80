"""A PyTorch script on this machine as the only node (host = "local"): torchrun, and its progress told with
homegpu.trainer.report's one line."""

from __future__ import annotations

import json
import sys

from helpers import homegpu, local_cluster_toml, read_metrics

from simcluster import free_job_port

SCRIPT = """\
import os
import torch
import torch.distributed as dist
from homegpu.report import epoch_done

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
for epoch in range(3):
    loss = torch.tensor([1.0 / (epoch + 1)])
    dist.all_reduce(loss)
    epoch_done(epoch + 1, 3, loss=loss.item() / dist.get_world_size())
print("WORLD_SIZE", os.environ["WORLD_SIZE"], "RANK", os.environ["RANK"], flush=True)
dist.destroy_process_group()
"""


def test_a_script_tells_its_epochs_in_one_line_each(pytorch, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "ddp.py").write_text(SCRIPT)
    job = f'[jobs.mine]\nscript = "ddp.py"\npython = "{sys.executable}"\nport = {free_job_port()}\n'
    config = local_cluster_toml(code, jobs=job)
    result = homegpu("--config", str(config), "run", "mine", "--no-tui", cwd=code, timeout=300)
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "here * epoch 3/3  loss 0.3333" in result.stdout, result.stdout  # framework read from the imports
    assert "WORLD_SIZE 1 RANK 0" in result.stdout
    (run_dir,) = (code / "experiments").iterdir()
    epochs = [m["epoch"] for m in read_metrics(run_dir) if m.get("event") == "epoch"]
    assert epochs == [1, 2, 3]
    manifest = json.loads((run_dir / "run.json").read_text())  # what the node ran, not a TF_CONFIG
    assert manifest["tf_configs"] == {}
    (line,) = manifest["torchrun"].values()
    assert line.startswith("torchrun --nnodes=1 --nproc-per-node=1 --node-rank=0 --master-addr=") and line.endswith("ddp.py"), line
    assert "torchrun per node" in (run_dir / "report.html").read_text()
