"""The trainer lets a peer go quiet long enough for a Wi-Fi drop (tests/test_lan_faults.py runs one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from homegpu.trainer.coordination import DEFAULT_PEER_TIMEOUT, peer_timeout


def test_peer_timeout_defaults_reads_the_environment_and_refuses_nonsense():
    assert peer_timeout({}) == DEFAULT_PEER_TIMEOUT == 120.0
    assert peer_timeout({"HOMEGPU_PEER_TIMEOUT": "30"}) == 30.0
    for wrong in ("5", "nan", "1e9", "soon"):
        with pytest.raises(ValueError):
            peer_timeout({"HOMEGPU_PEER_TIMEOUT": wrong})


def test_the_coordination_service_gets_the_leader_the_jobs_and_the_longer_heartbeat(tensorflow):
    tf_config = {"cluster": {"worker": ["127.0.0.1:24001", "127.0.0.1:24002"]}, "task": {"type": "worker", "index": 1}}
    script = ("from homegpu.trainer.coordination import tolerate_quiet_peers; tolerate_quiet_peers(90)\n"
              "from tensorflow.python.eager import context; print(context.context().coordination_service)")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TF_CONFIG": json.dumps(tf_config)})
    assert result.returncode == 0, result.stderr
    said = result.stdout
    assert "heartbeat_timeout_in_ms: 90000" in said
    assert 'service_leader: "/job:worker/replica:0/task:0"' in said and "num_tasks: 2" in said
