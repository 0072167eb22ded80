"""One duration parser for every key of cluster.toml that takes a duration (remote/config/durations.py):
each form it reads, the old ones included, and its one-line errors naming file, key and an example."""

from __future__ import annotations

import pytest

from homegpu.remote.config import ConfigError, duration_seconds, parse_cluster
from homegpu.remote.config.key_tables import SECTIONS

NODE = '[[nodes]]\nname = "box"\nhost = "10.0.0.1"\nmac = "a8:a1:59:0c:22:7e"\n'
JOB = '[jobs.train]\n'
# Every duration key, where it goes, and how to read its seconds back from the spec.
DURATION_KEYS = {
    "connect_timeout": ("[cluster]", lambda spec: spec.ssh.connect_timeout),
    "keepalive_interval": ("[cluster]", lambda spec: spec.ssh.keepalive_interval),
    "stats_interval": ("[cluster]", lambda spec: spec.stats_interval),
    "sleep_after": ("[[nodes]]", lambda spec: spec.nodes[0].sleep_wake.sleep_after),
    "wake_timeout": ("[[nodes]]", lambda spec: spec.nodes[0].sleep_wake.wake_timeout),
    "stall_timeout": ("[jobs.train]", lambda spec: spec.jobs["train"].stall_timeout),
    "reconnect_timeout": ("[jobs.train]", lambda spec: spec.jobs["train"].reconnect_timeout),
    "node_offline_seconds": ("[alerts]", lambda spec: spec.alerts.node_offline_seconds),
    "command_timeout": ("[alerts]", lambda spec: spec.alerts.command_timeout),
}


def cluster_with(key: str, value: str) -> str:
    """cluster.toml with `key = value` in its section; the duration keys are its only settings."""
    section = DURATION_KEYS[key][0]
    line = f"{key} = {value}\n"
    if section == "[[nodes]]":
        return NODE + line
    return NODE + f"{section}\n{line}" if section != "[jobs.train]" else NODE + JOB + line


@pytest.mark.parametrize("value, seconds", [
    (90, 90.0), (1.5, 1.5), ("90", 90.0), ("2.5", 2.5),  # a number, or a number as text: seconds
    ("90s", 90.0), ("5m", 300.0), ("2h", 7200.0), ("1d", 86_400.0), ("1w", 604_800.0),  # sleep_after's old forms
    ("1.5h", 5400.0), (" 30m ", 1800.0), ("2 h", 7200.0),
    ("1h30m", 5400.0), ("1h 30m", 5400.0), ("1w2d3h4m5s", 788_645.0), ("1m0.5s", 60.5),  # several units
])
def test_every_form_reads_as_its_seconds(value, seconds) -> None:
    assert duration_seconds(value) == seconds


@pytest.mark.parametrize("value", [
    "", "soon", "h", "5 minutes", "1e5", "-5", "1h30", "30m1h", "1h1h", "5M", "1,5h", "h1", True, None, [1], {},
])
def test_what_is_not_a_duration_is_none(value) -> None:
    assert duration_seconds(value) is None


def test_an_integer_too_large_for_a_float_is_infinite_so_a_range_refuses_it() -> None:
    assert duration_seconds(10 ** 400) == float("inf")


@pytest.mark.parametrize("key", sorted(DURATION_KEYS))
@pytest.mark.parametrize("value, seconds", [("600", 600.0), ('"600"', 600.0), ('"10m"', 600.0),
                                            ('"0h10m"', 600.0), ("600.0", 600.0)])
def test_every_duration_key_takes_every_form(key: str, value: str, seconds: float) -> None:
    spec = parse_cluster(cluster_with(key, value))
    read = DURATION_KEYS[key][1](spec)
    assert read == seconds and type(read) is float


@pytest.mark.parametrize("key", sorted(DURATION_KEYS))
@pytest.mark.parametrize("value, problem", [
    ('"soon"', "'soon' is not a duration"),
    ('"30m1h"', "'30m1h' is not a duration"),
    ("true", "expected a duration, got a boolean True"),
    ('["5m"]', "expected a duration, got a list ['5m']"),
])
def test_a_wrong_duration_is_one_line_naming_file_key_and_an_example(key: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_cluster(cluster_with(key, value), file="lab.toml")
    message = str(raised.value)
    section = DURATION_KEYS[key][0]
    shown = f"{section} #1.{key}" if section == "[[nodes]]" else f"{section}.{key}"
    assert message.startswith("lab.toml:") and f": {shown}: {problem}; " in message and "\n" not in message, message
    assert f'{key} = 1.5, {key} = "90s", "5m" or "1h30m"' in message, message


@pytest.mark.parametrize("key, value, problem", [
    ("stall_timeout", '"8d"', "must be from 1 to 604800 seconds (a week), got '8d'"),
    ("stall_timeout", "0", "must be from 1 to 604800 seconds (a week), got 0"),
    ("connect_timeout", '"2h"', "must be from 0.1 to 3600 seconds, got '2h'"),
    ("sleep_after", '"2s"', "must be from 10 to 604800 seconds (a week), got '2s'"),
    ("wake_timeout", "1e309", "must be from 5 to 3600 seconds (an hour), got inf"),
    ("command_timeout", "nan", "must be from 1 to 3600 seconds, got nan"),
])
def test_a_duration_out_of_range_says_the_range(key: str, value: str, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_cluster(cluster_with(key, value))
    assert f"{problem}; use a duration in that range" in str(raised.value)


def test_the_reference_says_each_duration_keys_forms_and_slurms_time_limit_its_own() -> None:
    types = {key.name: key.type for section in SECTIONS for key in section.keys}
    for key in DURATION_KEYS:
        assert '`"90s"`, `"5m"`, `"1h30m"`' in types[key], (key, types[key])
    assert "Slurm's own forms" in types["time_limit"] and '"1h30m"' not in types["time_limit"]
    others = [name for name, kind in types.items() if '"1h30m"' in kind]
    assert sorted(others) == sorted(DURATION_KEYS)
