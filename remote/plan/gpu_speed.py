"""A rough speed for a GPU model (or a CPU), so a device plan can say which worker sets the pace.

Under synchronous data parallelism every step waits for the slowest worker, so only the *ratios*
between workers matter. The figures below are relative training throughput (mixed precision where
the card has tensor cores), normalised to an RTX 3090 = 1.0, rounded from public benchmark tables
(Lambda's GPU benchmarks, TechPowerUp's FP16/FP32 figures). They are estimates to tell a CPU from a
GPU and a T4 from an H100, not measurements: a job's own timeline (examples/s per worker from its
last run) beats them, and the plan prefers it where there is one.
"""

from __future__ import annotations

import re

# CPU training of the kind homegpu runs (a small CNN, tf-keras) on a desktop or laptop processor.
CPU_SPEED = 0.05
# A GPU whose name is in no row below: a mid-range card.
UNKNOWN_GPU_SPEED = 0.5

# Model key (lower case, as it appears in the driver's name) -> relative speed. Keys are matched
# as whole words, longest first, so "3090 ti" wins over "3090" and "a100" over "a10".
GPU_SPEEDS = {
    "h200": 3.6, "gh200": 3.6, "h100": 3.2, "h800": 3.0, "a100": 2.0, "a800": 1.9,
    "l40s": 1.6, "l40": 1.3, "l4": 0.4, "a40": 1.0, "a30": 1.0, "a10": 0.65, "a10g": 0.6, "a16": 0.2, "a2": 0.15,
    "v100": 0.9, "v100s": 0.95, "p100": 0.45, "p40": 0.35, "t4": 0.3, "k80": 0.1,
    "rtx 6000 ada": 1.6, "rtx a6000": 1.1, "rtx a5000": 0.85, "rtx a4000": 0.6, "titan rtx": 0.75,
    "titan v": 0.85, "titan xp": 0.45,
    "rtx 5090": 2.2, "rtx 5080": 1.4, "rtx 5070 ti": 1.15, "rtx 5070": 0.9, "rtx 5060 ti": 0.6,
    "rtx 4090": 1.7, "rtx 4080 super": 1.25, "rtx 4080": 1.2, "rtx 4070 ti super": 1.05,
    "rtx 4070 ti": 0.95, "rtx 4070 super": 0.85, "rtx 4070": 0.75, "rtx 4060 ti": 0.55,
    "rtx 4060": 0.45,
    "rtx 3090 ti": 1.1, "rtx 3090": 1.0, "rtx 3080 ti": 0.95, "rtx 3080": 0.85, "rtx 3070 ti": 0.65,
    "rtx 3070": 0.6, "rtx 3060 ti": 0.5, "rtx 3060": 0.4, "rtx 3050": 0.25,
    "rtx 2080 ti": 0.7, "rtx 2080 super": 0.55, "rtx 2080": 0.5, "rtx 2070 super": 0.45,
    "rtx 2070": 0.4, "rtx 2060 super": 0.38, "rtx 2060": 0.33,
    "gtx 1660 ti": 0.22, "gtx 1660 super": 0.21, "gtx 1660": 0.19, "gtx 1650": 0.12,
    "gtx 1080 ti": 0.4, "gtx 1080": 0.3, "gtx 1070 ti": 0.27, "gtx 1070": 0.24, "gtx 1060": 0.15,
}
_KEYS = sorted(GPU_SPEEDS, key=len, reverse=True)
_PATTERNS = [(re.compile(rf"(?<![a-z0-9]){re.escape(key)}(?![a-z0-9])"), key) for key in _KEYS]


def short_gpu_name(name: str) -> str:
    """"NVIDIA GeForce RTX 3090" -> "RTX 3090": the vendor words every card repeats, dropped."""
    words = [w for w in str(name).split() if w.lower() not in ("nvidia", "geforce", "tesla", "quadro")]
    return " ".join(words) or str(name)


def gpu_model(name: str) -> str | None:
    """The table key a driver's GPU name matches ("rtx 3090"), or None for a card not in it."""
    text = " ".join(str(name).lower().replace("-", " ").split())
    text = text.replace("geforce ", "").replace("nvidia ", "")
    for pattern, key in _PATTERNS:
        if pattern.search(text):
            return key
    return None


def gpu_speed(name: str) -> float:
    """The relative speed of one GPU by its driver name (RTX 3090 = 1.0); unknown cards get
    :data:`UNKNOWN_GPU_SPEED`."""
    key = gpu_model(name)
    return GPU_SPEEDS[key] if key else UNKNOWN_GPU_SPEED
