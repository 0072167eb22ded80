"""docs/reference.md against the validator: the page is what remote/config/reference.py writes from the key
tables, every key the validator accepts is in it (and nothing else), and every example in it validates."""

from __future__ import annotations

import copy
import re
import tomllib
from pathlib import Path

import pytest
import tomli_w

from homegpu.remote.config import ConfigError, duration_seconds, parse_cluster
from homegpu.remote.config.checks import Validator
from homegpu.remote.config.key_tables import SECTIONS
from homegpu.remote.config.keys import REFERENCE_PAGE
from homegpu.remote.config.slurm_keys import SLURM_JOB_KEYS
from homegpu.remote.config.reference import COMMAND, fill

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / REFERENCE_PAGE

# A file with every section, the keys some examples need beside them set (a price for the budgets and
# tariffs, a mac for the power keys, a second node to wake closet through).
BASE = {
    "cluster": {"price_per_kwh": 0.3},
    "nodes": [{"name": "desktop", "host": "local"}, {"name": "closet", "host": "closet", "mac": "a8:a1:59:0c:22:7e",
                                                     "idle_watts": 40}],
    "jobs": {"train": {}},
    "alerts": {"job_failed": True},
}
# What the Slurm keys need beside them: a cluster whose runs go through Slurm (the job keys are refused elsewhere).
SLURM_CLUSTER = {"scheduler": "slurm", "slurm_login": "desktop"}
NEEDS_SLURM = {("[cluster]", "scheduler"), ("[cluster]", "slurm_login")} | {("[jobs.NAME]", k) for k in SLURM_JOB_KEYS}
COMPANIONS = {("[jobs.NAME]", "on_fewer_workers"): {"min_workers": 1},  # a key refused without another one
              ("[jobs.NAME]", "checkpoint"): {"script": "train.py"}}


def page_keys() -> dict[str, set[str]]:
    """Each section's keys as the page lists them: the first cell of each row of its generated table."""
    text = PAGE.read_text(encoding="utf-8")
    regions = re.findall(r"<!-- keys of (\S+): .*?-->\n(.*?)<!-- end of the keys of \1 -->", text, re.S)
    return {header: set(re.findall(r"^\| `([a-z_]+)` \|", body, re.M)) for header, body in regions}


def accepted_keys(monkeypatch) -> dict[str, set[str]]:
    """Each section's keys as the validator accepts them, caught where it refuses unknown ones."""
    accepted: dict[str, set[str]] = {}
    real = Validator.unknown_keys

    def recording(self, table, path, allowed, hint):
        header = {"cluster": "[cluster]", "nodes": "[[nodes]]", "jobs": "[jobs.NAME]", "alerts": "[alerts]"}[path[0]]
        accepted[header] = set(allowed)
        return real(self, table, path, allowed, hint)

    monkeypatch.setattr(Validator, "unknown_keys", recording)
    parse_cluster(tomli_w.dumps(BASE))
    return accepted


def test_the_page_is_what_the_key_tables_write():
    text = PAGE.read_text(encoding="utf-8")
    assert fill(text) == text, f"{REFERENCE_PAGE} is stale: run `{COMMAND}` and commit it"


def test_every_key_the_validator_accepts_is_in_the_reference_and_nothing_else(monkeypatch):
    documented, accepted = page_keys(), accepted_keys(monkeypatch)
    assert set(documented) == set(accepted) == {"[cluster]", "[[nodes]]", "[jobs.NAME]", "[alerts]"}
    for header, keys in accepted.items():
        assert keys - documented[header] == set(), f"{header} accepts keys {REFERENCE_PAGE} does not list"
        assert documented[header] - keys == set(), f"{REFERENCE_PAGE} lists {header} keys the validator refuses"


@pytest.mark.parametrize("section, key", [(section, key) for section in SECTIONS for key in section.keys],
                         ids=lambda item: getattr(item, "name", None) or getattr(item, "header", ""))
def test_each_keys_example_validates(section, key, tmp_path):
    example = tomllib.loads(key.example)
    assert list(example) == [key.name], f"the example of {key.name} sets {list(example)}"
    data = copy.deepcopy(BASE)
    where = {"[cluster]": data["cluster"], "[[nodes]]": data["nodes"][1], "[jobs.NAME]": data["jobs"]["train"],
             "[alerts]": data["alerts"]}[section.header]
    where.update(example)
    where.update(COMPANIONS.get((section.header, key.name), {}))
    if (section.header, key.name) in NEEDS_SLURM:
        data["cluster"] = {**SLURM_CLUSTER, **data["cluster"]}
    (tmp_path / "cluster.toml").write_text(tomli_w.dumps(data), encoding="utf-8")
    parse_cluster(tomli_w.dumps(data), str(tmp_path / "cluster.toml"))


def test_an_unknown_key_points_at_the_reference():
    data = {**BASE, "nodes": [{"name": "desktop", "host": "local", "gpus": 2}]}
    with pytest.raises(ConfigError) as error:
        parse_cluster(tomli_w.dumps(data))
    assert str(error.value).endswith(f"unknown key 'gpus'; see the [[nodes]] reference in {REFERENCE_PAGE}")
    assert PAGE.is_file()


def _default_literal(text: str) -> tuple[bool, object]:
    """(True, value) for a default the reference writes as one TOML value in backticks (`3`, `"docker"`)."""
    if not re.fullmatch(r"`[^`]+`", text):
        return False, None
    try:
        return True, tomllib.loads(f"value = {text.strip('`')}")["value"]
    except tomllib.TOMLDecodeError:
        return False, None


def test_each_default_the_reference_gives_is_what_a_left_out_key_becomes():
    spec = parse_cluster(tomli_w.dumps(BASE))
    node, job = spec.nodes[0], spec.jobs["train"]  # desktop and train set none of their keys
    holders = {"[cluster]": (spec, spec.ssh, spec.tariff), "[[nodes]]": (node, node.sleep_wake), "[jobs.NAME]": (job,),
               "[alerts]": (spec.alerts,)}
    checked = 0
    for section in SECTIONS:
        set_in_base = set(BASE["cluster"]) | set(BASE["alerts"]) if section.header in ("[cluster]", "[alerts]") else set()
        for key in section.keys:
            literal, value = _default_literal(key.default)
            if not literal or key.name in set_in_base:
                continue
            holder = next(h for h in holders[section.header] if hasattr(h, key.name))
            actual = getattr(holder, key.name)
            if key.name == "wake_timeout":
                value = duration_seconds(value)
            assert actual == (tuple(value) if isinstance(value, list) else dict(value) if isinstance(value, dict)
                              else value), f"{section.header} {key.name}: the reference says {key.default}, it is {actual!r}"
            checked += 1
    assert checked >= 30, f"only {checked} defaults checked: the rest are not one TOML value"
