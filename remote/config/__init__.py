"""homegpu.remote.config: cluster.toml read, validated and turned into frozen specs, and written back:
ClusterSpec with its NodeSpecs, JobSpecs and AlertRules; every mistake one ConfigError line.
"""

from __future__ import annotations

from homegpu.remote.config.alert_rules import BUDGETS, SWITCHES, AlertRules, NotifyTarget
from homegpu.remote.config.checks import MAX_PORT, ConfigError
from homegpu.remote.config.cluster_spec import (
    DEFAULT_CONFIG_NAME, DEMO_JOB, EMBEDDED_DEFAULT, ClusterSpec, embedded_default, find_config, load_cluster,
    parse_cluster,
)
from homegpu.remote.config.home_dirs import cache_dir, cluster_data_path, data_dir
from homegpu.remote.config.job_spec import (
    AUTO, DEFAULT_IMAGE, DEFAULT_IMAGES, DEFAULT_JOB_PORT, FRAMEWORK_NAMES, FRAMEWORKS, KEEP_GLOBAL_BATCH, KEEP_WORKER_BATCH, PER_GPU, JobSpec,
    parse_job_table,
)
from homegpu.remote.config.durations import duration_seconds
from homegpu.remote.config.node_sleep_wake import NodeSleepWake
from homegpu.remote.config.node_spec import LOCAL_HOST, RUNTIMES, NodeSpec
from homegpu.remote.config.sizes import size_text
from homegpu.remote.config.slurm_keys import SLURM_JOB_KEYS, format_time_limit, gres_gpus, time_limit_seconds
from homegpu.remote.config.tariff import Tariff
from homegpu.remote.config.writer import cluster_to_toml, starter_cluster

__all__ = [
    "AUTO", "DEFAULT_CONFIG_NAME", "DEFAULT_IMAGE", "DEFAULT_IMAGES", "DEFAULT_JOB_PORT", "DEMO_JOB", "EMBEDDED_DEFAULT", "FRAMEWORK_NAMES", "FRAMEWORKS", "LOCAL_HOST",
    "KEEP_GLOBAL_BATCH", "KEEP_WORKER_BATCH", "MAX_PORT", "PER_GPU",
    "RUNTIMES", "BUDGETS", "SWITCHES", "AlertRules", "ClusterSpec", "ConfigError", "JobSpec", "NodeSleepWake", "NodeSpec", "NotifyTarget", "Tariff", "cache_dir",
    "cluster_data_path", "cluster_to_toml", "data_dir", "duration_seconds", "embedded_default", "find_config", "load_cluster", "parse_cluster", "parse_job_table",
    "size_text", "starter_cluster", "SLURM_JOB_KEYS", "format_time_limit", "gres_gpus", "time_limit_seconds",
]
