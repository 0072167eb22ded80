"""Stats for the history store's test and benchmark: real recorded agent output, parsed by the controller's
own parser (remote/nodes/stats.parse_agent_line).

- `h100_lines()`: the stats agent's NVML lines recorded on a real NVIDIA H100 80GB HBM3 under load
  (tests/fixtures/gpu/h100-80gb-hbm3/agent_nvml.jsonl): one GPU at 100 %, one `python3` holding 20076 MiB.
- `TUI_LINES`: the agent lines in tests/fixtures/tui/ (an H100 with MIG under load, three processes and
  no utilisation reading; two H100 NVL idle; a CPU-only node).
- `sxm8_idle()`: `nvidia-smi --query-gpu` recorded on 8 idle H100 SXM (tests/fixtures/gpu/), turned into an
  agent line by the agent's own CSV parser.

The recordings predate process owners, so a process's owner is added here in the agent's JSON format
(remote/node_side/agent/process_owners.py) before parsing; nothing else of a recording changes.
"""

from __future__ import annotations

import json
from pathlib import Path

from homegpu.remote.events import NodeStats
from homegpu.remote.node_side.agent import smi_parse
from homegpu.remote.nodes.stats import parse_agent_line

FIXTURES = Path(__file__).parent / "fixtures"
H100 = FIXTURES / "gpu" / "h100-80gb-hbm3" / "agent_nvml.jsonl"
TUI_LINES = ("h100_mig_load", "h100nvl_idle", "cpu_only")


def worker(user: str, job: str, run_id: str, index: int = 0, uid: int = 1000) -> dict:
    return {"kind": "worker", "user": user, "uid": uid, "run_id": run_id, "job": job, "index": index}


def process(user: str | None, uid: int | None = 1000) -> dict:
    return {"kind": "process", "user": user, "uid": uid}


def h100_lines() -> list[dict]:
    return [json.loads(line) for line in H100.read_text().splitlines() if line.strip()]


def tui_line(name: str) -> dict:
    return json.loads((FIXTURES / "tui" / f"{name}.json").read_text())


def sxm8_idle() -> dict:
    """An agent line for 8 idle H100 SXM: the recorded nvidia-smi CSV through the agent's parser, on the
    H100 NVL node's line (its CPU, memory, load)."""
    gpus = smi_parse.parse_nvidia_smi_gpus((FIXTURES / "gpu" / "gpus_8x_h100sxm_idle.csv").read_text())
    driver = gpus[0].pop("driver")
    for gpu in gpus:
        gpu.pop("driver", None)
        gpu["processes"] = []
    return dict(tui_line("h100nvl_idle"), gpus=gpus, driver=driver)


def owned(line: dict, *owners: list[dict | None]) -> NodeStats:
    """`line` parsed, with owners[g][p] as the owner of process p of GPU g (a shorter list leaves the rest
    without an owner, as an older agent's)."""
    line = json.loads(json.dumps(line))
    for gpu, gpu_owners in zip(line["gpus"], owners):
        for proc, owner in zip(gpu["processes"], gpu_owners):
            proc["owner"] = owner
    return parse_agent_line(json.dumps(line))


def parsed(line: dict) -> NodeStats:
    return parse_agent_line(json.dumps(line))
