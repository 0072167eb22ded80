"""A process held to its job's `gpu_memory` ($HOMEGPU_GPU_MEMORY, bytes) on its GPU, so that runs sharing a card
cannot starve each other. Each framework is held its own way, once it is imported:

- TensorFlow: a logical device with that `memory_limit` on each GPU it sees, set right after `import tensorflow`
  (TensorFlow takes it only before its GPUs are first used). A script's own `set_memory_growth` then says it
  is left out instead of failing, as TensorFlow would fail it beside a logical device.
- PyTorch: `torch.cuda.set_per_process_memory_fraction` (the budget over the card's memory) on the GPU this
  process uses (torchrun's LOCAL_RANK), right after `import torch`.
- JAX: XLA_PYTHON_CLIENT_MEM_FRACTION (the budget over the card's memory, from nvidia-smi), which JAX reads when
  it starts its backend, after the import.

Each says once what it held, or that there is no GPU to hold. A process that runs out of memory says after
its traceback that it was held to the budget (OVER_BUDGET), which the known causes read to name the key.
Standard library only here; the frameworks are the script's to import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Mapping

from homegpu.trainer.import_hooks import after_import

BUDGET_ENV = "HOMEGPU_GPU_MEMORY"
OVER_BUDGET = "this process was held to the job's gpu_memory"  # known_causes.py reads it
JAX_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
_MIB = 1024 ** 2
_HELD: list[str] = []  # the frameworks this process held on a GPU: only those can go over the budget
_NO_GPU_SAID: list[str] = []  # the framework that found no GPU first, and said so
# lower-cased: PyTorch's "CUDA out of memory", XLA's "Out of memory" (JAX), TensorFlow's "OOM when allocating"
_OUT_OF_MEMORY = ("out of memory", "oom when allocating")


def budget(env: Mapping[str, str] = os.environ) -> int:
    """The job's gpu_memory in bytes; 0: none (the whole card)."""
    try:
        return max(0, int(env.get(BUDGET_ENV) or 0))
    except ValueError:
        return 0


def budget_text(size: int) -> str:
    """5368709120 as "5.0 GiB", 536870912 as "512 MiB": how homegpu says a size."""
    for unit, scale in (("TiB", 1024 ** 4), ("GiB", 1024 ** 3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size // _MIB} MiB"


def hold_to_budget(env: os._Environ | dict = os.environ) -> None:
    """Hold whichever framework this process imports to the job's gpu_memory; nothing without one."""
    size = budget(env)
    if not size:
        return
    after_import("tensorflow", lambda: hold_tensorflow(size))
    after_import("torch", lambda: hold_torch(size, int(env.get("LOCAL_RANK") or 0)))
    after_import("jax", lambda: hold_jax(size, env))
    _say_over_budget_after_tracebacks(size)


def hold_tensorflow(size: int) -> None:
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=size // _MIB)])
    if gpus:
        _leave_out_memory_growth(tf, size)
    _say("TensorFlow", size, len(gpus))


def _leave_out_memory_growth(tf, size: int) -> None:
    """A script's set_memory_growth(gpu, True), which TensorFlow refuses beside a logical device, is left out."""
    def set_memory_growth(device, enable) -> None:
        print(f"homegpu: set_memory_growth({enable}) is left out: the job's gpu_memory holds {device.name} to "
              f"{budget_text(size)}", file=sys.stderr, flush=True)
    tf.config.experimental.set_memory_growth = set_memory_growth


def hold_torch(size: int, local_rank: int) -> None:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank < gpus:
        total = torch.cuda.get_device_properties(local_rank).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, size / total), local_rank)
    _say("PyTorch", size, int(local_rank < gpus))


def hold_jax(size: int, env: os._Environ | dict) -> None:
    """XLA_PYTHON_CLIENT_MEM_FRACTION, unless the job's env sets it; JAX reads it when its backend starts."""
    if JAX_FRACTION_ENV in env:
        return
    total = card_memory(first_visible(env))
    if total:
        env[JAX_FRACTION_ENV] = f"{min(1.0, size / total):.4f}"
    _say("JAX", size, int(bool(total)))


def first_visible(env: Mapping[str, str] = os.environ) -> str:
    """The card a process's first GPU is, as nvidia-smi and NVML name it: CUDA_VISIBLE_DEVICES' first (homegpu
    gives a process worker its cards by nvidia-smi's index; a container sees its own from 0)."""
    return env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"


def card_total(gpu: str) -> int | None:
    """GPU `gpu`'s memory in bytes (its index or UUID): NVML's where pynvml imports and the driver answers (no
    process started), else nvidia-smi's; None where neither knows it."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(gpu)) if gpu.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(gpu))
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no pynvml, no driver (NVMLError), a MIG name: nvidia-smi may still know
        return card_memory(gpu)


def card_memory(gpu: str) -> int | None:
    """GPU `gpu`'s memory in bytes, from nvidia-smi; None where there is none (a CPU machine)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", gpu],
                             capture_output=True, text=True, timeout=30).stdout
        return int(float(out.split()[0]) * _MIB)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _say(framework: str, size: int, gpus: int) -> None:
    """What `framework` was held to; that there is no GPU, once (TensorFlow may import JAX, for one)."""
    if gpus:
        _HELD.append(framework)
        words = f"{framework} held to it on " + ("its GPU" if gpus == 1 else f"each of its {gpus} GPUs")
    elif _NO_GPU_SAID:
        return
    else:
        _NO_GPU_SAID.append(framework)
        words = "no GPU here, nothing to hold"
    print(f"homegpu: gpu_memory {budget_text(size)}: {words}", file=sys.stderr, flush=True)


def say_if_over_budget(error: BaseException, size: int | None = None, held: bool | None = None) -> None:
    """After an out-of-memory error's traceback: that this process was held to the job's gpu_memory, where a
    framework was held on a GPU (`held`; by default, whether one was here)."""
    size = budget() if size is None else size
    held = bool(_HELD) if held is None else held
    text = f"{type(error).__name__}: {error}".lower()
    if size and held and ("resourceexhaustederror" in text or any(words in text for words in _OUT_OF_MEMORY)):
        print(f"homegpu: {OVER_BUDGET} ({budget_text(size)})", file=sys.stderr, flush=True)


def _say_over_budget_after_tracebacks(size: int) -> None:
    previous = sys.excepthook

    def hook(kind, error, tb) -> None:
        previous(kind, error, tb)
        say_if_over_budget(error, size)
    sys.excepthook = hook
