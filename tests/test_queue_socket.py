"""The queue's socket, for real: serve's end (QueueServer over a QueueDesk and a real store) and the commands'
end (QueueClient, and the `homegpu` CLI) talking over a Unix socket, and two Unix users kept apart.

The two-user tests need root (CI runs as root): a child Python imports homegpu as root, then drops to
`nobody` before it opens anything, so the test does not depend on where the checkout lives.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import NOBODY, as_nobody, nobody_argv, wait_until

from homegpu.remote.config import load_cluster
from homegpu.remote.queue import (
    EntryState, NoServe, QueueClient, QueueDesk, QueueError, QueueServer, QueueStore, socket_path,
)
from homegpu.remote.queue.rendezvous import private_folder

CLUSTER = """
[cluster]
name = "lab"

[[nodes]]
name = "here"
host = "local"

[jobs.train]
epochs = 3
"""


@pytest.fixture
def open_folder() -> Path:
    """A folder anyone may read, for a cluster file another user must read too (pytest's tmp_path is root's)."""
    folder = Path(tempfile.mkdtemp(prefix="homegpu-queue-test-"))
    folder.chmod(0o755)
    yield folder
    subprocess.run(["rm", "-rf", str(folder)], check=True)


@pytest.fixture
def spec(open_folder: Path):
    path = open_folder / "cluster.toml"
    path.write_text(CLUSTER)
    path.chmod(0o644)
    return load_cluster(path)


@pytest.fixture
async def served(spec, tmp_path):
    """A serve's queue end at the cluster's socket; yields (store, server)."""
    store = QueueStore(tmp_path / "queue.sqlite")
    server = await QueueServer(socket_path(spec), QueueDesk(spec, store)).start()
    try:
        yield store, server
    finally:
        await server.close()
        store.close()
        subprocess.run(["rm", "-rf", str(socket_path(spec).parent)], check=True)


async def test_submit_list_and_cancel_go_through_the_socket(spec, served):
    store, server = served
    client = QueueClient(server.path)
    first = await client.submit("train", overrides=["epochs=5", "env.SEED=3"], priority=2)
    second = await client.submit("train", after=[first.id])
    assert (first.id, second.id) == ("q-1", "q-2")
    assert store.get("q-1").overrides == ("epochs=5", "env.SEED=3") and store.get("q-1").priority == 2
    assert store.get("q-2").after == ("q-1",) and store.get("q-2").user == _me()
    assert [entry.id for entry in await client.entries()] == ["q-1", "q-2"]
    cancelled = await client.cancel("1")
    assert cancelled.state is EntryState.CANCELLED and cancelled.reason == f"cancelled by {_me()}"
    assert store.get("q-1").state is EntryState.CANCELLED


async def test_the_socket_is_its_users_alone(spec, served):
    _, server = served
    assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(server.path.parent.stat().st_mode) == 0o700
    assert server.path.parent.stat().st_uid == os.getuid()


async def test_a_clean_stop_removes_the_sockets_folder_unless_something_else_is_in_it(spec, tmp_path):
    """No /tmp/homegpu-queue-HASH is left by a serve that stopped cleanly; a folder holding more than the
    socket is left as it is, with what it holds."""
    path = socket_path(spec)
    try:
        with QueueStore(tmp_path / "queue.sqlite") as store:
            server = await QueueServer(path, QueueDesk(spec, store)).start()
            await server.close()
            assert not path.parent.exists()
            server = await QueueServer(path, QueueDesk(spec, store)).start()
            (path.parent / "notes").write_text("not serve's")
            await server.close()
        assert not path.exists() and (path.parent / "notes").read_text() == "not serve's"
    finally:
        subprocess.run(["rm", "-rf", str(path.parent)], check=True)


@pytest.mark.parametrize("request_args, words", [
    ({"job": "evaluate"}, "no job 'evaluate' in"),
    ({"job": "train", "overrides": ["nodes=[\"here\"]"]}, "nodes decides where the job runs"),
    ({"job": "train", "overrides": ["epochs=many"]}, "--set epochs=many"),
    ({"job": "train", "after": ["q-9"]}, "--after q-9: no such queue entry"),
])
async def test_a_bad_submission_is_one_line_and_adds_nothing(served, request_args, words):
    store, server = served
    with pytest.raises(QueueError) as caught:
        await QueueClient(server.path).submit(**request_args)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert store.entries() == []


async def test_without_serve_the_commands_say_how_to_start_one(spec, open_folder):
    client = QueueClient(socket_path(spec), "homegpu --config cluster.toml serve")
    with pytest.raises(NoServe, match=r"start one with `homegpu --config cluster.toml serve`"):
        await client.entries()
    stale = open_folder / "stale.sock"  # a serve killed with SIGKILL leaves its socket behind
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(stale))
    listener.close()
    with pytest.raises(NoServe, match="no homegpu serve runs"):
        await QueueClient(stale).entries()


def test_the_cli_without_serve_is_one_line_and_exit_2(spec):
    result = subprocess.run([sys.executable, "-m", "homegpu.tui.cli.main", "--config", spec.source, "submit", "train"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "start one with `homegpu --config" in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_second_serve_of_the_cluster_is_refused_and_a_dead_ones_socket_replaced(spec, served, tmp_path):
    _, server = served
    with QueueStore(tmp_path / "other.sqlite") as store:
        with pytest.raises(QueueError, match="another homegpu serve already runs this cluster's queue"):
            await QueueServer(server.path, QueueDesk(spec, store)).start()
    assert await QueueClient(server.path).entries() == []  # the first one's socket was left alone
    await server.close()
    private_folder(server.path.parent)  # what a killed serve leaves: its folder, and its socket in it
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(server.path))
    listener.close()
    with QueueStore(tmp_path / "other.sqlite") as store:
        again = await QueueServer(server.path, QueueDesk(spec, store)).start()
        try:
            assert await QueueClient(server.path).entries() == []
        finally:
            await again.close()


def test_a_folder_another_user_made_first_is_refused_and_an_open_one_of_ours_closed(root, open_folder):
    theirs = open_folder / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(QueueError, match=r"belongs to nobody.*rm -r"):
        private_folder(theirs)
    ours = open_folder / "ours"
    ours.mkdir(mode=0o777)
    ours.chmod(0o777)
    private_folder(ours)
    assert stat.S_IMODE(ours.stat().st_mode) == 0o700
    not_a_folder = open_folder / "file"
    not_a_folder.write_text("")
    with pytest.raises(QueueError, match="is not a folder"):
        private_folder(not_a_folder)


async def test_another_user_is_refused_in_one_line(root, spec, served):
    """nobody runs `homegpu submit` against root's serve: the 0700 folder keeps it out, and it is told whose
    queue it is, in one line, with nothing added."""
    store, _ = served
    result = await asyncio.to_thread(as_nobody, f"sys.exit(homegpu.tui.cli.main.main(['--config', {spec.source!r}, "
                                                f"'submit', 'train']))")
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"this cluster's queue is {_me()}'s" in result.stderr
    assert store.entries() == []


async def test_root_is_refused_by_another_users_serve(root, open_folder, tmp_path):
    """No file mode stops root: serve checks who is at the other end of the socket too."""
    path = Path(tempfile.mkdtemp(prefix="homegpu-queue-nobody-")) / "q" / "queue.sock"
    path.parent.parent.chmod(0o777)
    (open_folder / "cluster.toml").write_text(CLUSTER)
    serve = await asyncio.create_subprocess_exec(*nobody_argv(
        "import asyncio, pathlib, tempfile\n"
        "from homegpu.remote.config import load_cluster\n"
        "from homegpu.remote.queue import QueueDesk, QueueServer, QueueStore\n"
        "async def serve():\n"
        f"    spec = load_cluster({str(open_folder / 'cluster.toml')!r})\n"
        "    store = QueueStore(pathlib.Path(tempfile.mkdtemp()) / 'queue.sqlite')\n"
        f"    await QueueServer({str(path)!r}, QueueDesk(spec, store)).start()\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(serve())\n"), cwd="/")
    try:
        await wait_until(path.exists, 60, f"the other user's socket {path}")
        with pytest.raises(QueueError, match=f"this queue is nobody's .*{_me()} may not submit"):
            await QueueClient(path).submit("train")
    finally:
        serve.kill()
        await serve.wait()
        subprocess.run(["rm", "-rf", str(path.parent.parent)], check=True)


def _me() -> str:
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name
