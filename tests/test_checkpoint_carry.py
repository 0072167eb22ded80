"""A script's checkpoint carried from its chief to every worker before a restart (remote/jobs/checkpoint_copy.py):
the copy through the local node's real file transfer and sync, and runs of a script written for a shared
filesystem (tests/fixtures/scripts/chief_snapshot.py: only its chief saves) on this machine as the only node, two
workers there with a working dir each. pytorch/examples' own multinode.py on two machines of the LAN:
tests/test_pytorch_lan.py."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from helpers import homegpu, local_cluster_toml

from homegpu.remote.config import embedded_default
from homegpu.remote.events import Metric
from homegpu.remote.jobs.checkpoint_copy import CheckpointCopy
from homegpu.remote.jobs.resume_check import Carried, FirstEpochs, disagreement, drift_line
from homegpu.remote.nodes import Cluster
from simcluster import free_job_port

CHIEF_SNAPSHOT = Path(__file__).parent / "fixtures" / "scripts" / "chief_snapshot.py"


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


async def test_what_the_chief_wrote_is_put_into_every_workers_working_dir_and_nothing_else_is_touched(tmp_path):
    chief, worker = tmp_path / "out" / "n0", tmp_path / "out" / "n1"
    write(chief, {"snapshot.pt": b"epoch 3", "ckpt/shard-0": b"weights", "backup/chief/ckpt-3.index": b"tf's",
                  "workertemp_1/x": b"not the chief's", "__pycache__/m.pyc": b"bytecode"})
    write(worker, {"snapshot.pt": b"epoch 1", "own.log": b"the worker's own"})
    copy = CheckpointCopy(tmp_path / "experiments" / "run" / "chief-checkpoint")
    async with Cluster(embedded_default(), stream_stats=False) as cluster:
        node = cluster.node("local")
        await node.wait_online(60)
        assert await copy.put([(node, str(worker))]) == []  # no copy yet: nothing is put
        assert await copy.take(node, str(chief), 3) == "" and copy.epoch == 3
        assert copy.files == ("ckpt/shard-0", "snapshot.pt") and copy.left == ("workertemp_1/x",)
        assert await copy.put([(node, str(worker)), (node, str(chief))]) == []
        assert files_under(worker) == {"ckpt/shard-0": b"weights", "own.log": b"the worker's own",
                                       "snapshot.pt": b"epoch 3"}
        assert (worker / "snapshot.pt").stat().st_mtime // 1 == (chief / "snapshot.pt").stat().st_mtime // 1

        (chief / "ckpt" / "shard-0").unlink()  # a script that keeps its last checkpoints only
        write(chief, {"ckpt/shard-1": b"newer"})
        assert await copy.take(node, str(chief), 4) == "" and await copy.put([(node, str(worker))]) == []
        assert files_under(worker) == {"ckpt/shard-1": b"newer", "own.log": b"the worker's own",
                                       "snapshot.pt": b"epoch 3"}

        named = CheckpointCopy(tmp_path / "named", checkpoint="ckpt")
        assert await named.take(node, str(chief), 4) == "" and named.files == ("ckpt/shard-1",)
        assert named.left == ("snapshot.pt", "workertemp_1/x")
        small = CheckpointCopy(tmp_path / "small", cap=20)
        assert await small.take(node, str(chief), 4) == "" and small.epoch == 4
        write(chief, {"ckpt/shard-2": b"grown past the cap"})
        refused = await small.take(node, str(chief), 5)
        assert await copy.take(node, str(tmp_path / "none"), 5) == "" and copy.epoch == 4  # nothing there: kept
    assert refused.startswith("the chief's checkpoint is ") and "past the 20 B homegpu carries" in refused
    assert small.epoch is None and not small.folder.exists() and "job's checkpoint key" in refused  # none put


def snapshot_job(tmp_path: Path, fail: str, **keys: str) -> tuple[Path, Path]:
    """cluster.toml (and the code beside it) running chief_snapshot.py as two workers on this machine."""
    code, shared = tmp_path / "code", tmp_path / "shared"
    code.mkdir()
    shared.mkdir()
    shutil.copy(CHIEF_SNAPSHOT, code / "train.py")
    extra = "".join(f'{key} = "{value}"\n' for key, value in keys.items())
    job = (f'[jobs.snap]\nscript = "train.py"\npython = "{sys.executable}"\nargs = ["{shared}", "{fail}"]\n'
           f'workers_per_node = 2\nport = {free_job_port()}\nmax_restarts = 3\nstall_timeout = 120\n{extra}')
    return local_cluster_toml(code, jobs=job), code


def test_a_script_that_saves_on_its_chief_only_resumes_on_every_worker_from_the_same_epoch(tmp_path):
    config, code = snapshot_job(tmp_path, "once")
    result = homegpu("--config", str(config), "run", "snap", "--no-tui", cwd=code, timeout=300)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout + result.stderr
    after = result.stdout[result.stdout.index("generation 2 starting"):]
    for worker in ("here", "here#1"):  # the chief's snapshot after epoch 1 reached here#1 before generation 2
        assert f"{worker} | Resuming from snapshot at Epoch 2" in after, result.stdout
    assert "generation 3" not in result.stdout
    (run_dir,) = (code / "experiments").iterdir()
    assert not (run_dir / "chief-checkpoint").exists()  # its copy let go once the chief's outputs came home
    assert (run_dir / "output" / "snapshot.json").read_text() == '{"epochs": 5}'


def firsts(*metrics_by_worker: tuple[str, list[dict]]) -> dict[str, FirstEpochs]:
    noted = {}
    for label, metrics in metrics_by_worker:
        noted[label] = FirstEpochs()
        for fields in metrics:
            noted[label].note(Metric(fields))
    return noted


def test_workers_that_begin_a_generation_at_different_epochs_disagree():
    start = [{"event": "start", "initial_epoch": 3}, {"event": "epoch", "epoch": 4, "loss": 0.2}]
    over = [{"event": "start", "initial_epoch": 0}, {"event": "epoch", "epoch": 1, "loss": 0.9}]
    assert disagreement(firsts(("node1", start), ("node2", start))) is None
    assert disagreement(firsts(("node1", start), ("node2", over))) == {"node1": 3, "node2": 0}
    assert disagreement(firsts(("node1", start), ("node2", []))) is None  # one has said: nothing to compare yet
    # epoch lines alone (a summary after each epoch), and a start that cannot tell them apart
    assert disagreement(firsts(("n0", [{"event": "epoch", "epoch": 3}]), ("n1", [{"event": "epoch", "epoch": 1}]))) \
        == {"n0": 2, "n1": 0}
    same_start = [{"event": "start", "initial_epoch": 0}]
    assert disagreement(firsts(("n0", same_start + [{"event": "epoch", "epoch": 2}]),
                               ("n1", same_start + [{"event": "epoch", "epoch": 1}]))) == {"n0": 1, "n1": 0}


def test_the_drift_line_names_the_checkpoint_missing_where():
    said = {"node1": 3, "node2": 0}
    where = "/root/.homegpu/runs/r/out/node1"
    assert drift_line(said, "node1", Carried(where, ("model.pt",), ("snapshot.pt",), key="model.pt")) == (
        "workers would resume from different epochs (node1 with 3 epochs done, node2 with none done): node2 lacks "
        "snapshot.pt from node1's working dir, which the job's checkpoint = \"model.pt\" leaves out: name what the "
        "script resumes from there; stopped rather than restarted")
    assert drift_line(said, "node1", Carried(where)) == (
        "workers would resume from different epochs (node1 with 3 epochs done, node2 with none done): node2 lacks the "
        f"checkpoint node1 resumed from, which is not in node1's working dir {where}, where homegpu carries it from: "
        "save it under a relative path, or on a filesystem every node shares; stopped rather than restarted")
    assert "(it carried events.out)" in drift_line(said, "node1", Carried(where, ("events.out",)))
    assert ": node1 lacks the checkpoint node2 resumed from, which is not the chief's (node1)" in drift_line(
        {"node1": 0, "node2": 3}, "node1", Carried(where))
    refused = "the chief's checkpoint is 3.0 GB, past the 2.0 GiB homegpu carries to the other workers; name …"
    assert f"none done): {refused}; stopped" in drift_line(said, "node1", Carried(where, refused=refused))


def test_a_checkpoint_the_key_leaves_out_stops_the_run_at_once_naming_it(tmp_path):
    config, code = snapshot_job(tmp_path, "once", checkpoint="model.json")  # the script saves snapshot.json
    result = homegpu("--config", str(config), "run", "snap", "--no-tui", cwd=code, timeout=300)
    print(result.stdout[-4000:])
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("run failed: ")]
    assert re.fullmatch(r"run failed: workers would resume from different epochs \(here with \d epochs? done, here#1 "
                        r"with none done\): here#1 lacks snapshot\.json from here's working dir, which the job's "
                        r'checkpoint = "model\.json" leaves out: name what the script resumes from there; stopped '
                        r"rather than restarted", line), line
    assert "generation 3" not in result.stdout and "restarts 2" not in result.stdout  # no restart spent on it


def test_an_error_that_ends_two_generations_in_a_row_stops_the_restarts_naming_it(tmp_path):
    config, code = snapshot_job(tmp_path, "always")  # here#1 raises at epoch 2 in every generation
    result = homegpu("--config", str(config), "run", "snap", "--no-tui", cwd=code, timeout=300)
    print(result.stdout[-4000:])
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("run failed: ")]
    assert line == ("run failed: the same error ended generations 1 and 2: here#1: RuntimeError: the peer's collective "
                    "broke at train.py:49; not restarted again, since every generation would meet it: fix the script "
                    "and run again"), line
    assert "generation 3" not in result.stdout  # two of its three restarts left unspent
