"""`[jobs.NAME]` tables: what to train, where, and how to recover, as a frozen JobSpec.

Validated by the same walker as the rest of cluster.toml (config._Validator), so a mistake here
gives the same one-line, located error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from homegpu.remote.config import NodeSpec

DEFAULT_IMAGE = "homegpu/tensorflow:2.21"
DEFAULT_JOB_PORT = 23456
RESTART_POLICIES = ("never", "on-failure")
MODELS = ("cnn", "resnet")

_IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DATA_RE = re.compile(r"^(synthetic|(npz|dir):.+)$")

_JOB_KEYS = {
    "image", "python", "script", "code_dir", "args", "data", "model", "data_dir", "env", "nodes",
    "workers_per_node", "port", "epochs", "batch_size", "steps_per_epoch", "restart", "max_restarts",
    "stall_timeout",
}


@dataclass(frozen=True)
class JobSpec:
    """One training job. With no `script` it runs the built-in trainer (`data`, `model`)."""

    name: str
    image: str = DEFAULT_IMAGE
    python: str = ""
    script: str = ""
    code_dir: str = ""
    args: tuple[str, ...] = ()
    data: str = "synthetic"
    model: str = "cnn"
    data_dir: str = ""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    nodes: tuple[str, ...] = ()
    workers_per_node: int = 1
    port: int = DEFAULT_JOB_PORT
    epochs: int = 2
    batch_size: int = 64
    steps_per_epoch: int = 0
    restart: str = "on-failure"
    max_restarts: int = 3
    stall_timeout: float = 300.0

    @property
    def uses_trainer(self) -> bool:
        return not self.script

    def python_for(self, node: "NodeSpec") -> str:
        return self.python or node.python


def parse_job(v: Any, name: str, table: dict, node_names: tuple[str, ...]) -> JobSpec:
    """Validate one [jobs.NAME] table with config's validator `v`. Raises ConfigError."""
    path = ("jobs", name)
    v.unknown_keys(table, path, _JOB_KEYS, "see the [jobs.NAME] reference in README.md")
    get = v.getter(table, path)

    def check_nodes(key_path: tuple, value: list) -> None:
        for item in value:
            if item not in node_names:
                raise v.fail(key_path, f"unknown node {item!r}", f"use names from [[nodes]]: {', '.join(node_names)}")
        if len(set(value)) != len(value):
            raise v.fail(key_path, "a node is listed twice", "list each node once")
        if not value:
            raise v.fail(key_path, "the node list is empty", "leave nodes out to use every node")

    return JobSpec(
        name=name,
        image=get("image", str, DEFAULT_IMAGE, _check_image(v)),
        python=get("python", str, "", v.check_path),
        script=get("script", str, "", v.check_path),
        code_dir=get("code_dir", str, "", v.check_path),
        args=tuple(get("args", list, [], _check_strings(v))),
        data=get("data", str, "synthetic", _check_data(v)),
        model=get("model", str, "cnn", _check_choice(v, MODELS)),
        data_dir=get("data_dir", str, "", v.check_path),
        env=MappingProxyType(get("env", dict, {}, _check_env(v))),
        nodes=tuple(get("nodes", list, [], check_nodes)),
        workers_per_node=get("workers_per_node", int, 1, v.check_positive),
        port=get("port", int, DEFAULT_JOB_PORT, v.check_port),
        epochs=get("epochs", int, 2, v.check_positive),
        batch_size=get("batch_size", int, 64, v.check_positive),
        steps_per_epoch=get("steps_per_epoch", int, 0, _check_not_negative(v)),
        restart=get("restart", str, "on-failure", _check_choice(v, RESTART_POLICIES)),
        max_restarts=get("max_restarts", int, 3, _check_not_negative(v)),
        stall_timeout=get("stall_timeout", float, 300.0, v.check_positive),
    )


def _check_image(v: Any):
    def check(path: tuple, value: str) -> None:
        if not _IMAGE_RE.match(value):
            raise v.fail(path, f"invalid image name {value!r}", 'use a Docker image name such as "homegpu/tensorflow:2.21"')
    return check


def _check_strings(v: Any):
    def check(path: tuple, value: list) -> None:
        for item in value:
            if not isinstance(item, str):
                raise v.fail(path, f"{item!r} is not a string", 'write every argument in quotes: args = ["--lr", "0.01"]')
    return check


def _check_data(v: Any):
    def check(path: tuple, value: str) -> None:
        if not _DATA_RE.match(value):
            raise v.fail(path, f"unknown data source {value!r}",
                         'use "synthetic", "npz:PATH" (mnist-format) or "dir:PATH" (one folder per class)')
        v.check_safe(path, value, "a data source")
    return check


def _check_choice(v: Any, choices: tuple[str, ...]):
    def check(path: tuple, value: str) -> None:
        if value not in choices:
            raise v.fail(path, f"unknown value {value!r}", "use one of: " + ", ".join(f'"{c}"' for c in choices))
    return check


def _check_env(v: Any):
    def check(path: tuple, value: dict) -> None:
        for key, item in value.items():
            if not _ENV_KEY_RE.match(key):
                raise v.fail(path + (key,), f"invalid variable name {key!r}", "use letters, digits and _")
            if not isinstance(item, str):
                raise v.fail(path + (key,), f"value {item!r} is not a string", f'write it in quotes: {key} = "{item}"')
    return check


def _check_not_negative(v: Any):
    def check(path: tuple, value: int) -> None:
        if value < 0:
            raise v.fail(path, f"must be 0 or more, got {value}", "use a whole number, 0 or more")
    return check
