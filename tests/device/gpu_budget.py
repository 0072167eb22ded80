"""On a machine with a GPU (the device machine, when a session is lent one): each framework held to a job's
gpu_memory as homegpu's trainer holds it, then asked for more than that. Not part of the suite, which has no GPU:
tests/test_gpu_budget_frameworks.py says what it can show on a CPU.

    python tests/device/gpu_budget.py [tensorflow|torch|jax ...]

Each framework runs in a process of its own, started as a worker is (`python -m homegpu.trainer.user_script`,
HOMEGPU_GPU_MEMORY = 2 GiB). The script allocates 1 GiB (must fit), then 3 GiB more (must fail out of memory),
and prints what it saw; the run's stderr must end with homegpu's line naming the budget. One JSON line per
framework: {"framework", "fit", "refused", "said"}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BUDGET = 2 * 1024 ** 3
SCRIPTS = {
    "tensorflow": "import tensorflow as tf\n"
                  "a = tf.ones([256, 1024, 1024]); print('fit', float(tf.reduce_sum(a[0, 0])), flush=True)\n"
                  "b = tf.ones([768, 1024, 1024]); print('not refused', float(tf.reduce_sum(b[0, 0])), flush=True)\n",
    "torch": "import torch\n"
             "a = torch.ones(256, 1024, 1024, device='cuda'); print('fit', a[0, 0, 0].item(), flush=True)\n"
             "b = torch.ones(768, 1024, 1024, device='cuda'); print('not refused', b[0, 0, 0].item(), flush=True)\n",
    "jax": "import jax.numpy as jnp\n"
           "a = jnp.ones((256, 1024, 1024)); print('fit', float(a[0, 0, 0]), flush=True)\n"
           "b = jnp.ones((768, 1024, 1024)); print('not refused', float(b[0, 0, 0]), flush=True)\n",
}


def check(framework: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "alloc.py"
        script.write_text(SCRIPTS[framework])
        env = {**os.environ, "HOMEGPU_GPU_MEMORY": str(BUDGET), "LOCAL_RANK": "0"}
        done = subprocess.run([sys.executable, "-m", "homegpu.trainer.user_script", str(script)], env=env,
                              capture_output=True, text=True, timeout=600)
    return {"framework": framework, "fit": "fit 1.0" in done.stdout, "refused": "not refused" not in done.stdout
            and done.returncode != 0, "said": "held to the job's gpu_memory (2.0 GiB)" in done.stderr,
            "stderr_tail": done.stderr[-600:]}


if __name__ == "__main__":
    for name in sys.argv[1:] or list(SCRIPTS):
        print(json.dumps(check(name)), flush=True)
