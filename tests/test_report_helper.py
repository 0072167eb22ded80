"""homegpu.report (trainer/report/): a script's one-line progress, as homegpu reads it, and nothing outside a run."""

from __future__ import annotations

import json

import pytest

from homegpu.trainer.metrics import parse_metric_line
from homegpu.report import epoch_done


@pytest.fixture
def in_a_run(monkeypatch, tmp_path):
    for name in ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOMEGPU_OUTPUT_DIR", str(tmp_path))
    return monkeypatch


def test_outside_a_run_it_prints_nothing(monkeypatch, capsys):
    monkeypatch.delenv("HOMEGPU_OUTPUT_DIR", raising=False)
    epoch_done(1, 5, loss=0.5)
    assert capsys.readouterr().out == ""


def test_under_torchrun_the_nodes_first_process_speaks_for_its_node(in_a_run, capsys):
    in_a_run.setenv("GROUP_RANK", "1")
    in_a_run.setenv("GROUP_WORLD_SIZE", "2")
    in_a_run.setenv("LOCAL_RANK", "0")
    epoch_done(3, 10, loss=float("nan"), accuracy=0.75)
    fields = parse_metric_line(capsys.readouterr().out.strip())
    assert fields["event"] == "epoch" and (fields["epoch"], fields["epochs"]) == (3, 10)
    assert (fields["worker"], fields["workers"], fields["loss"], fields["accuracy"]) == (1, 2, None, 0.75)
    in_a_run.setenv("LOCAL_RANK", "1")
    epoch_done(3, 10, loss=0.5)
    assert capsys.readouterr().out == ""


def test_under_tensorflow_the_worker_is_tf_configs(in_a_run, capsys):
    in_a_run.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1", "c:1"]},
                                             "task": {"type": "worker", "index": 2}}))
    epoch_done(1, loss=0.25)
    fields = parse_metric_line(capsys.readouterr().out.strip())
    assert (fields["worker"], fields["workers"], fields["epochs"]) == (2, 3, None)
