"""The doctor's GPU rows: the GPUs NVML sees against those `nvidia-smi` sees (the stats agent's two
readings), and whether Docker can hand the GPUs to containers. Pure: remote/doctor/judge.py calls them.

The two must agree on the GPUs and their memory sizes; memory used may differ only by what a moment
apart explains (a steady gap is the driver's reservation, which NVML without version-2 memory info
counts). When `nvidia-smi` lists GPUs but NVML does not load in the node's Python, that is a ✗, not a
footnote: `nvidia-smi` is itself an NVML client, so the node has a driver whose library its Python
cannot load (a half-finished install or upgrade, a library outside the loader path, or tools from
another driver on PATH). Stats then come from the slower `nvidia-smi` fallback, and the NVIDIA
container toolkit (which loads the same libnvidia-ml) will not give containers the GPUs either.
"""

from __future__ import annotations

from homegpu.remote.doctor.check import Check
from homegpu.remote.events import NodeStats
from homegpu.remote.nodes import describe_gpus

MEMORY_SLACK_MIB = 64  # NVML and nvidia-smi memory used may differ this much (read a moment apart)


def _source_note(stats: NodeStats, prefix: str) -> str:
    notes = [e[len(prefix):].lstrip(": ") for e in stats.errors if e.startswith(prefix)]
    return notes[0] if notes else "unknown reason"


_MISMATCH_FIX = "Driver/library mismatch: reboot, or reinstall the NVIDIA driver if that does not help."
_NO_NVML_FIX = ("Make the driver's libnvidia-ml.so.1 loadable for the node's python "
                "(`ldconfig -p | grep nvidia-ml` shows it), or reinstall the NVIDIA driver.")
_NO_PYNVML_FIX = "Install nvidia-ml-py where homegpu runs (pip install nvidia-ml-py); homegpu ships it to the nodes."


def gpu_check(node: str, nvml: NodeStats | str, smi: NodeStats | str, python_ok: bool = True,
              containers: bool = False) -> Check:
    """Compare the GPUs NVML sees with those nvidia-smi sees (see the module docstring for why a
    one-sided view is ✗). Each side is the agent's stats with that source, or why the agent failed;
    `containers` says the node runs jobs in Docker, whose GPU hand-out needs NVML too."""
    name = "gpus"
    if isinstance(nvml, str) or isinstance(smi, str):
        if not python_ok:
            return Check(node, name, None, "skipped: needs a working python3")
        return Check(node, name, False, f"the stats agent failed: {nvml if isinstance(nvml, str) else smi}",
                     "Run `homegpu status` to see the agent's error, and report a bug if it persists.")
    nvml_up, smi_up = nvml.source == "nvml", smi.source == "nvidia-smi"
    if nvml_up and smi_up:
        return _compare_gpu_lists(node, nvml, smi)
    if nvml_up:
        if not nvml.gpus:
            return Check(node, name, True, "no GPU (CPU-only node: trains on CPU)")
        return Check(node, name, True, f"{describe_gpus(nvml)} (NVML; nvidia-smi is not on PATH)")
    if smi_up and smi.gpus:
        why = _source_note(nvml, "nvml")
        fix = _NO_PYNVML_FIX if "pynvml is not importable" in why else _NO_NVML_FIX
        effect = "stats fall back to nvidia-smi" + (" and Docker cannot hand these GPUs to containers"
                                                    if containers else "")
        return Check(node, name, False, f"nvidia-smi sees {describe_gpus(smi)}, but NVML does not load "
                     f"({why}); {effect}", fix)
    if smi_up and smi.errors:
        return Check(node, name, False, f"nvidia-smi cannot reach the driver: {smi.errors[0]}",
                     "Load the driver: reboot, or reinstall the NVIDIA driver for the running kernel.")
    return Check(node, name, True, "no GPU (CPU-only node: trains on CPU)")


def _compare_gpu_lists(node: str, nvml: NodeStats, smi: NodeStats) -> Check:
    """The same GPUs (by UUID), the same memory sizes, and memory used within MEMORY_SLACK_MIB:
    the two readings are taken a moment apart, so a working GPU's usage may move in between."""
    nvml_ids, smi_ids = sorted(map(str, (g.uuid for g in nvml.gpus))), sorted(map(str, (g.uuid for g in smi.gpus)))
    if nvml_ids != smi_ids:
        return Check(node, "gpus", False, f"NVML sees {len(nvml_ids)} GPUs {nvml_ids}, "
                     f"nvidia-smi sees {len(smi_ids)} {smi_ids}", _MISMATCH_FIX)
    if not nvml.gpus:
        return Check(node, "gpus", True, "no GPU (CPU-only node: trains on CPU)")
    totals, used = _memory_differences(nvml, smi)
    if totals:
        return Check(node, "gpus", False, f"NVML and nvidia-smi disagree on memory size: {'; '.join(totals)}",
                     _MISMATCH_FIX)
    if used:
        return Check(node, "gpus", True, f"{describe_gpus(nvml)}; memory used differs: {'; '.join(used)} "
                     "(a steady gap is the driver's reservation, which NVML without version-2 memory info "
                     "counts as used: a newer NVIDIA driver shows nvidia-smi's figure)")
    return Check(node, "gpus", True, f"{describe_gpus(nvml)} (NVML and nvidia-smi agree)")


def _memory_differences(nvml: NodeStats, smi: NodeStats) -> tuple[list[str], list[str]]:
    """Per GPU, where the two disagree on total memory, and where on memory used beyond the slack."""
    theirs = {str(gpu.uuid): gpu for gpu in smi.gpus}
    totals, used = [], []
    for gpu in nvml.gpus:
        other = theirs[str(gpu.uuid)]
        if _numbers(gpu.mem_total, other.mem_total) and gpu.mem_total != other.mem_total:
            totals.append(f"GPU {gpu.index} {gpu.mem_total} MiB (NVML), {other.mem_total} MiB (nvidia-smi)")
        if _numbers(gpu.mem_used, other.mem_used) and abs(gpu.mem_used - other.mem_used) > MEMORY_SLACK_MIB:
            used.append(f"GPU {gpu.index} {gpu.mem_used} MiB (NVML), {other.mem_used} MiB (nvidia-smi)")
    return totals, used


def _numbers(*values: object) -> bool:
    return all(isinstance(v, (int, float)) for v in values)


def container_runtime_check(node: str, runtime: str, docker_info: dict | None, gpu_count: int) -> Check:
    """Docker nodes with GPUs need the NVIDIA runtime registered, or NVIDIA CDI devices.
    `docker_info`: `docker info`'s JSON, None when the engine did not answer."""
    name = "nvidia container runtime"
    if runtime != "docker":
        return Check(node, name, None, f'not needed (runtime "{runtime}")')
    if gpu_count == 0:
        return Check(node, name, None, "not needed (no GPU)")
    if docker_info is None:
        return Check(node, name, None, "skipped: needs a working Docker engine")
    if "nvidia" in (docker_info.get("Runtimes") or {}):
        return Check(node, name, True, "nvidia runtime registered with Docker")
    cdi = [d.get("ID", "") for d in docker_info.get("DiscoveredDevices") or [] if isinstance(d, dict)]
    cdi = [device for device in cdi if device.startswith("nvidia.com/gpu")]
    if cdi:
        return Check(node, name, True, f"CDI devices {', '.join(cdi)}")
    return Check(node, name, False, "Docker has no nvidia runtime and no NVIDIA CDI devices, "
                 "so containers cannot use the GPUs",
                 "Install the NVIDIA Container Toolkit, then run "
                 "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`.")
