"""A simulated homegpu cluster: real OpenSSH servers on machines of a LAN in a box.

Every simulated node is a network namespace of its own on a bridge (tests/simnet.py): its own
address 10.213.0.N, sshd on port 22 of it, a link shaped to 1 Gbit/s that a test can slow down or
cut, and a private `~/.homegpu` (the node's work dir on this machine, bind-mounted in the node's own
mount namespace, so neither the controller nor another node sees it at that path). An ssh config
gives every node an alias (`Host node1` / `HostName 10.213.0.2` / key / known_hosts) and homegpu reads
it as it reads a user's ~/.ssh/config (HOMEGPU_SSH_CONFIG); cluster.toml names the nodes by alias,
with no `address`, as users write it. Real SSH handshakes, strict host key checking, real remote
processes: nothing here is mocked.

A node can sleep and wake on LAN for a `with node.sleepy()` block (tests/simsleep.py): its sleep command
kills all of it but a wake listener in its namespace, whose magic packet starts its sshd again.

The rest of the filesystem is this machine's, shared: an extra directory on a node's PATH is how
tests give one node a fake `nvidia-smi`, and one on its LD_LIBRARY_PATH a fake `libcuda.so.1`.

Used by tests/conftest.py; importable on its own (no pytest needed).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import random
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import AbstractSet, Any, Iterable, Iterator, Mapping

import tomli_w

import simidle
import simnet
import simshell
import simsleep
import tiers

SSHD = "/usr/sbin/sshd"
DOCKER_SOCKET = "/var/run/docker.sock"
PRIVSEP_DIR = "/run/sshd"
# Where sshd's exec'd commands look for programs; the node's extra_path goes in front of it.
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Set in every SSH session of a node (and inherited by whatever it starts, detached or not),
# so stop() can find processes that left the sshd process tree with setsid/nohup.
MARKER_VAR = "HOMEGPU_SIMNODE"
# homegpu reads the ssh config named here instead of ~/.ssh/config (remote/nodes/connect.py).
SSH_CONFIG_VAR = "HOMEGPU_SSH_CONFIG"
NODE_HOME = pwd.getpwnam("root").pw_dir

_REQUIRED_TOOLS = (
    (SSHD, "openssh-server"),
    ("ssh-keygen", "openssh-client"),
    ("ssh", "openssh-client"),
    ("iperf3", "iperf3"),
    ("ip", "iproute2"),
    ("tc", "iproute2"),
    ("unshare", "util-linux"),
    ("iptables", "iptables"),
)


# Nodes started by this process and not stopped yet: stop_all() ends them at exit, so a test that
# fails between start() and close() cannot leave sshd servers behind.
_RUNNING: dict[int, SimNode] = {}
# ssh configs of the clusters this process runs, in the order homegpu should read them.
_SSH_CONFIGS: list[str] = []


class SimClusterError(RuntimeError):
    """The simulated cluster cannot be set up here; the message says what to install or fix."""


# -- prerequisites -------------------------------------------------------------------------------


def require_root_tools() -> None:
    """Raise SimClusterError unless we are root and sshd, ssh, ssh-keygen and iperf3 exist.

    The fixtures turn this into pytest.fail: a test machine that cannot run the cluster must be
    fixed, not silently skipped.
    """
    if os.geteuid() != 0:
        raise SimClusterError(
            "the simulated cluster needs root (network namespaces, sshd logging in as root); "
            "run the tests as root: bash tests/run.sh")
    missing = [(tool, pkg) for tool, pkg in _REQUIRED_TOOLS if not _tool_exists(tool)]
    if missing:
        names = ", ".join(tool for tool, _ in missing)
        packages = " ".join(sorted({pkg for _, pkg in missing}))
        raise SimClusterError(f"missing {names}; install with: apt-get install -y {packages}")


def _tool_exists(tool: str) -> bool:
    return os.access(tool, os.X_OK) if tool.startswith("/") else shutil.which(tool) is not None


# -- small process helpers -------------------------------------------------------------------------


def _run(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run a helper tool, raising SimClusterError with its output when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SimClusterError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def generate_ed25519_key(path: Path, comment: str) -> str:
    """Write a new passphrase-less ed25519 key pair at `path`; return the public key line."""
    for stale in (path, path.with_name(path.name + ".pub")):
        stale.unlink(missing_ok=True)  # ssh-keygen would otherwise ask before overwriting
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_name(path.name + ".pub").read_text().strip()


def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, state) for every process, read from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited while we looked
        fields = stat.rsplit(")", 1)[1].split()  # the command name may contain spaces
        table[int(entry)] = (int(fields[1]), fields[0])
    return table


def _has_env(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _descendants(roots: Iterable[int], table: Mapping[int, tuple[int, str]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root for root in roots if root in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def alive(pids: Iterable[int]) -> set[int]:
    """The pids that still run (zombies count as gone: they hold no resources but a table slot)."""
    table = _proc_table()
    return {pid for pid in pids if pid in table and table[pid][1] != "Z"}


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_gone(pids: set[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def free_port(address: str) -> int:
    """A TCP port nobody listens on at `address` right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def free_job_port(workers: int = 4) -> int:
    """A base port P with P..P+workers-1 free on every interface, below the ephemeral range.

    A job's workers on loopback nodes take consecutive ports and TensorFlow binds them on all
    interfaces; a kernel-picked port can have a busy neighbour (an outgoing connection's
    ephemeral port), so look where the kernel does not hand out ports.
    """
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 30000)
        if all(_wildcard_free(base + i) for i in range(workers)):
            return base
    raise SimClusterError("no run of free ports found in 20000-30000")


def _wildcard_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def ssh_banner(address: str, port: int, timeout: float = 1.0) -> bytes:
    """The first bytes an SSH server sends ("SSH-2.0-..."); raises OSError if none comes."""
    with socket.create_connection((address, port), timeout=timeout) as conn:
        return conn.recv(64)


# -- one node --------------------------------------------------------------------------------------


class SimNode:
    """One simulated machine: a network namespace with a real sshd on port 22 of its address.

    sshd runs in the foreground (-D) under Popen so its pid is ours. Each accepted connection is
    a forked sshd that calls setsid(), so the listener's process group does NOT cover sessions;
    stop()/kill() therefore walk the /proc process tree below the listener and also pick up
    anything carrying this node's marker variable or running in its namespace.
    """

    def __init__(self, name: str, host: int, root: Path, authorized_keys: Path, *,
                 extra_path: bool = False, port: int | None = None, alias: str | None = None,
                 mbit: int | None = simnet.DEFAULT_MBIT, login_banner: str | None = None,
                 lan: int = 0, jump: SimNode | None = None, gateway: bool = False,
                 pyenv: simshell.PyenvInit | None = None, idle_cpus: bool = False) -> None:
        self.name = name
        # CPUs of its own, idle, at /proc/stat (tests/simidle.py), rather than this machine's, which the suite keeps busy
        self.idle_cpus = idle_cpus
        if pyenv is None and login_banner is None:
            pyenv = simshell.default_pyenv()
        # A machine of the lab LAN (lan 1), reached through `jump` (ssh config ProxyJump); a gateway has
        # a second leg on the lab LAN, at 10.213.1.1, and its sshd forwards to the machines there.
        self.lan, self.jump, self.gateway = lan, jump, gateway
        # A line the node's ~/.bashrc echoes for every command (above any interactive guard, as on
        # Fedora or after a careless edit), or None for a silent shell.
        self.login_banner = login_banner
        # pyenv's init in the node's ~/.bashrc, above any guard (tests/simshell.py), or None.
        self.pyenv = pyenv
        # A RAPL tree in the kernel's powercap format (tests/rapl.py), seen by the node's sessions at
        # /sys/class/powercap (after a restart), or None: this machine has none (a VM), so neither has the node.
        self.powercap: Path | None = None
        self.alias = alias or name
        self._host = host
        self._address = simnet.address_of(host, lan)
        self._port = port or 22
        self._mbit = mbit
        self._namespace: str | None = None
        self._veth = ""
        self._dir = root / name
        self._sshd_dir = self._dir / "sshd"
        self._work_dir = self._dir / "work"
        self._extra_path = self._dir / "bin" if extra_path else None
        # A node with fake GPU tools on its PATH gets a folder for the driver's libraries too.
        self._extra_lib = self._dir / "lib" if extra_path else None
        self._authorized_keys = authorized_keys
        self._marker = f"{name}-{uuid.uuid4().hex[:12]}"
        self._proc: subprocess.Popen | None = None
        # An engine of the node's own (tests/simdocker.py), or None: the node uses this machine's.
        self.engine: Any = None
        # More variables for every session of the node (sshd's SetEnv), as a machine's /etc/environment sets
        # them: SLURM_CONF on the nodes of a Slurm cluster (tests/simslurm.py). Read at start(): a change
        # takes effect at the next restart().
        self.session_env: dict[str, str] = {}
        for folder in (self._sshd_dir, self._work_dir, self._extra_path, self._extra_lib):
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
        generate_ed25519_key(self.host_key_path, f"simnode-{name}")

    # -- properties --

    @property
    def address(self) -> str:
        """The node's LAN address (its namespace's eth0), where the controller reaches it."""
        return self._address

    @property
    def system_bus_socket(self) -> Path:
        """The node's own system bus socket (tests/simlogind.py); nothing listens there unless a test starts one."""
        return self._dir / "system_bus_socket"

    @property
    def system_bus_address(self) -> str:
        """What the node's sessions get as $DBUS_SYSTEM_BUS_ADDRESS: its own bus, never this machine's."""
        return f"unix:path={self.system_bus_socket}"

    @property
    def mac(self) -> str:
        """The MAC address of the node's eth0 ("aa:bb:cc:dd:ee:ff"), what Wake-on-LAN names; the same from
        start() to close() (restarts and sleep included), a new one for a node started again after close()."""
        if self._namespace is None:
            raise SimClusterError(f"{self.name} has no network interface: it is not started")
        return simsleep.mac_of(self._namespace)

    @property
    def port(self) -> int:
        """The SSH port: 22, as on a real machine, unless the node was made with another."""
        return self._port

    @property
    def namespace(self) -> str | None:
        """The network namespace's name while the node exists (between start() and close())."""
        return self._namespace

    @property
    def host_key_path(self) -> Path:
        return self._sshd_dir / "ssh_host_ed25519_key"

    @property
    def host_public_key(self) -> str:
        """The "ssh-ed25519 AAAA..." part of the host key (no comment): what known_hosts holds."""
        key_type, blob = (self._sshd_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return f"{key_type} {blob}"

    @property
    def known_hosts_line(self) -> str:
        hosts = [self.alias, self.address] if self.port == 22 else [
            f"[{self.alias}]:{self.port}", f"[{self.address}]:{self.port}"]
        return f"{','.join(hosts)} {self.host_public_key}"

    @property
    def work_dir(self) -> Path:
        """The node's `~/.homegpu` as seen from this machine (the test's view of the node's disk).

        On the node this directory is mounted at ~/.homegpu and that is where homegpu finds it; it is
        also reachable there under this path, which Docker nodes use (see SimCluster.cluster_dict).
        """
        return self._work_dir

    @property
    def extra_path(self) -> Path | None:
        """A directory put first in PATH by sshd for this node's sessions, or None."""
        return self._extra_path

    @property
    def extra_lib(self) -> Path | None:
        """A directory sshd puts in LD_LIBRARY_PATH for this node's sessions (a node with extra_path), or None:
        where a test puts a fake libcuda.so.1 (tests/fake_libcuda.py) that only this node's programs load."""
        return self._extra_lib

    @property
    def session_path(self) -> str:
        """PATH in the node's sessions, as sshd sets it (root's ~/.bashrc is not run: see SHLVL)."""
        return f"{self._extra_path}:{BASE_PATH}" if self._extra_path else BASE_PATH

    @property
    def has_own_bashrc(self) -> bool:
        """Whether the node's sessions read a ~/.bashrc of its own (tests/simshell.py); else bash reads none."""
        return self.login_banner is not None or self.pyenv is not None

    @property
    def _pyenv_shims(self) -> Path:
        return self._dir / "pyenv-shims"

    @property
    def pyenv_lock(self) -> str:
        """Where pyenv rehash's lock is on the node (~/.pyenv/shims/.pyenv-shim), as its logins name it."""
        return os.path.join(NODE_HOME, simshell.PYENV_SHIMS, simshell.PYENV_LOCK)

    @contextlib.contextmanager
    def stale_pyenv_lock(self) -> Iterator[str]:
        """For a `with` block, pyenv rehash's lock left behind, as a login cut off while it held the lock leaves
        it: every login waits for it (the node's PyenvInit.rehash_timeout). Yields its path on the node."""
        if self.pyenv is None:
            raise SimClusterError(f"{self.name} has no pyenv in its ~/.bashrc")
        lock = self._pyenv_shims / simshell.PYENV_LOCK
        lock.touch()
        try:
            yield self.pyenv_lock
        finally:
            lock.unlink(missing_ok=True)

    @property
    def pyenv_lock_left(self) -> bool:
        """Whether pyenv rehash's lock file is there now."""
        return (self._pyenv_shims / simshell.PYENV_LOCK).exists()

    @property
    def config_path(self) -> Path:
        return self._sshd_dir / "sshd_config"

    @property
    def log_path(self) -> Path:
        return self._sshd_dir / "sshd.log"

    @property
    def marker(self) -> str:
        """Value of $HOMEGPU_SIMNODE in this node's sessions."""
        return self._marker

    @property
    def pid(self) -> int | None:
        """The listener's pid while it runs."""
        return self._proc.pid if self.is_running else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle --

    def start(self, timeout: float = 10.0) -> None:
        """Start sshd in the node's namespace; return once it sends its SSH banner."""
        if self.is_running:
            return
        tiers.need("lan")
        os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)  # sshd refuses to run without it
        os.makedirs(os.path.join(NODE_HOME, ".homegpu"), exist_ok=True)  # the mount point
        if self._namespace is None:
            self._namespace, self._veth = simnet.add_node(self._host, self._mbit, self.lan)
            if self.gateway:
                simnet.add_leg(self._namespace, simnet.GATEWAY_HOST, simnet.LAB, self._mbit)
        if self.engine is not None:
            self.engine.ensure_running()  # before sshd: its mount namespace binds the engine's socket
        if not self._launch(timeout):
            raise SimClusterError(f"{self.name}: sshd on {self.address}:{self.port} did not start:\n"
                                  f"{self._log_tail()}")
        _RUNNING[id(self)] = self

    def _launch(self, timeout: float) -> bool:
        """True when listening, False when sshd exited (bad config)."""
        self._write_config()
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        # A mount namespace of its own, where the node's work dir is ~/.homegpu. `ip netns exec`,
        # unshare and sh all exec, so the pid is sshd's.
        home = shlex.join(["mount", "--bind", str(self._work_dir), os.path.join(NODE_HOME, ".homegpu")])
        if self.engine is not None:
            home += " && " + shlex.join(self.engine.bind_argv())
        if self.has_own_bashrc:  # the node's own ~/.bashrc, in its mount namespace only
            bashrc = self._sshd_dir / "bashrc"
            bashrc.write_text(simshell.bashrc(self.login_banner, self.pyenv))
            home += " && " + shlex.join(["mount", "--bind", str(bashrc), os.path.join(NODE_HOME, ".bashrc")])
        if self.pyenv is not None:  # its own pyenv shims folder, where the rehash lock lives
            self._pyenv_shims.mkdir(exist_ok=True)
            os.makedirs(os.path.join(NODE_HOME, simshell.PYENV_SHIMS), exist_ok=True)  # the mount point
            home += " && " + shlex.join(["mount", "--bind", str(self._pyenv_shims),
                                         os.path.join(NODE_HOME, simshell.PYENV_SHIMS)])
        if self.powercap is not None:
            home += " && " + self._powercap_mount()
        if self.idle_cpus:
            proc_stat = self._dir / "proc-stat"
            simidle.keep_idle(proc_stat)
            home += " && " + shlex.join(["mount", "--bind", str(proc_stat), "/proc/stat"])
        sshd = shlex.join([SSHD, "-D", "-f", str(self.config_path), "-E", str(self.log_path)])
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                ["ip", "netns", "exec", self._namespace, "unshare", "-m", "--propagation", "private",
                 "sh", "-c", f"{home} && exec {sshd}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        listening = f"Server listening on {self.address} port {self.port}."
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            # The controller has no leg on the lab LAN: there sshd's own word has to do.
            if listening in self._log_text(offset) and (self.lan or self._answers()):
                return True
            time.sleep(0.02)
        self.kill()
        raise SimClusterError(f"{self.name}: sshd did not answer within {timeout} s:\n{self._log_tail()}")

    def _powercap_mount(self) -> str:
        """Shell commands that show self.powercap at /sys/class/powercap in the node's mount namespace: sysfs
        takes no new folder, so /sys/class becomes a tmpfs holding a copy of its entries (symlinks into
        /sys/devices, which resolve as before) and the tree."""
        real = self._dir / "sys-class"
        real.mkdir(exist_ok=True)
        return (f"mount --bind /sys/class {shlex.quote(str(real))} && mount -t tmpfs -o mode=755 sysclass /sys/class"
                f" && {{ cp -a {shlex.quote(str(real))}/. /sys/class/ 2>/dev/null || true; }}"
                f" && mkdir -p /sys/class/powercap && mount --bind {shlex.quote(str(self.powercap))} /sys/class/powercap")

    def _answers(self) -> bool:
        try:
            return ssh_banner(self.address, self.port).startswith(b"SSH-")
        except OSError:
            return False

    def _write_config(self) -> None:
        options = {
            "ListenAddress": f"{self.address}:{self.port}",
            "HostKey": str(self.host_key_path),
            "PidFile": str(self._sshd_dir / "sshd.pid"),
            "UsePAM": "no",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "PubkeyAuthentication": "yes",
            "PermitRootLogin": "prohibit-password",
            "AuthorizedKeysFile": str(self._authorized_keys),
            "StrictModes": "no",  # the key file lives in a temp dir we do not chmod carefully
            "AllowTcpForwarding": "yes",
            "AllowStreamLocalForwarding": "yes",  # homegpu forwards the Docker socket
            "X11Forwarding": "no",
            "PrintMotd": "no",
            "UseDNS": "no",
            # The one setting raised for the suite's own speed: tests open many connections at once
            # (serve, a run and status against one node) and OpenSSH's default (10:30:100) drops
            # unauthenticated ones past 10 at random. MaxSessions keeps its default (10 channels a
            # connection), as on people's machines.
            "MaxStartups": "200",
            # Debian's default: sftp-server is started through the user's login shell (internal-sftp
            # is not), so a shell that prints breaks it, as it does for people.
            "Subsystem": "sftp /usr/lib/openssh/sftp-server",
            # SHLVL=1 makes bash skip ~/.bashrc, which it otherwise runs for every command sshd
            # hands it. Root's ~/.bashrc belongs to this machine, not to the node being simulated
            # (here it runs `pyenv init`, ~100 ms of CPU, and puts pyenv's python3 shim first);
            # with every node sharing two cores, that cost would be paid N times over serially.
            # A node with a login banner or pyenv has a ~/.bashrc of its own, which bash does read.
            "SetEnv": f"PATH={self.session_path} {'' if self.has_own_bashrc else 'SHLVL=1 '}"
                      f"{f'LD_LIBRARY_PATH={self._extra_lib} ' if self._extra_lib else ''}"
                      f"DBUS_SYSTEM_BUS_ADDRESS={self.system_bus_address} {MARKER_VAR}={self._marker}"
                      + "".join(f" {_set_env_word(name, value)}" for name, value in self.session_env.items()),
        }
        self.config_path.write_text("".join(f"{key} {value}\n" for key, value in options.items()))

    def _log_text(self, offset: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def _log_tail(self, lines: int = 15) -> str:
        return "\n".join(self._log_text().splitlines()[-lines:])

    def pids(self) -> set[int]:
        """Every live process of this node: listener, connection sshds, sessions, detached ones.

        The sshds themselves cannot be found by the marker (setproctitle overwrites their
        /proc/PID/environ), hence the walk down from the listener as well.
        """
        table = _proc_table()
        # returncode None: not reaped yet, so the pid is still ours even if it just died.
        roots = [self._proc.pid] if self._proc is not None and self._proc.returncode is None else []
        entry = f"{MARKER_VAR}={self._marker}".encode()
        marked = {pid for pid in table if _has_env(pid, entry)}
        inside = simnet.namespace_pids(self._namespace) if self._namespace else set()
        found = _descendants(roots, table) | _descendants(marked | inside, table)
        return {pid for pid in found if table[pid][1] != "Z"}

    def freeze(self, *, keep: AbstractSet[int] = frozenset()) -> set[int]:
        """Make the node silent: SIGSTOP all its processes (but those in `keep`) and return their pids.

        TCP connections stay open but nothing answers, so only timeouts and SSH keepalives can
        notice, as with an unplugged or hung machine. Repeats until no new process shows up: a
        stopped process cannot fork, so the returned set is complete.
        """
        frozen: set[int] = set()
        while new := self.pids() - frozen - keep:
            _signal_all(new, signal.SIGSTOP)
            frozen |= new
        return frozen

    def thaw(self) -> None:
        """Undo freeze()."""
        _signal_all(self.pids(), signal.SIGCONT)

    def stop(self, grace: float = 3.0) -> None:
        """Shut the node down: SIGTERM everything of it, SIGKILL what is left after `grace` s.

        The tree is frozen first so that the listener dying cannot orphan (and hide) connection
        sshds before they get the signal.
        """
        pids = self.freeze()
        _signal_all(pids, signal.SIGTERM)
        _signal_all(pids, signal.SIGCONT)
        _wait_gone(pids, grace)
        self.kill()

    def kill(self, *, keep: AbstractSet[int] = frozenset()) -> None:
        """Crash the node: SIGKILL the listener, every connection and every session at once (all
        but the processes in `keep`: a sleeping node's wake listener).

        Killing only the listener would not simulate a dead machine: existing connections live in
        their own setsid'd sshd processes and would keep working. Here the kernel closes their
        sockets, so clients see the connection drop at once. For a machine that goes silent
        instead (unplugged cable, kernel hang) use freeze().
        """
        while pids := self.freeze(keep=keep):
            _signal_all(pids, signal.SIGKILL)
            _wait_gone(pids, 5.0)
        if self._proc is not None:
            self._proc.wait(timeout=5)  # reap the listener: it is our child
        _RUNNING.pop(id(self), None)

    def restart(self) -> None:
        """Stop and start again on the same address and port (e.g. after regenerate_host_key)."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the node and delete its namespace and link: the machine is gone."""
        self.stop()
        if self.engine is not None:
            self.engine.remove()  # stop() ended its processes; its data goes
            self.engine = None
        if self._namespace is not None:
            self.restore_link()  # its drop rules on this machine's firewall go with it
            simnet.remove_node(self._namespace)
            self._namespace = None

    # -- the node's network link --

    def set_link_speed(self, mbit: int | None) -> None:
        """Shape the node's link (both directions) to `mbit` Mbit/s; None: unshaped (~10 Gbit/s)."""
        self._mbit = mbit
        if self._namespace is not None:
            simnet.set_speed(self._namespace, self._veth, mbit)

    def cut_link(self) -> None:
        """A Wi-Fi drop: nothing gets in or out, interfaces and open connections stay up."""
        simnet.set_link(self._namespace, self.address, up=False)

    def restore_link(self) -> None:
        """Let packets through again after cut_link()."""
        simnet.set_link(self._namespace, self.address, up=True)

    @contextlib.contextmanager
    def firewall(self, port: int, target: str = "DROP") -> Iterator[None]:
        """Block TCP `port` on the node for the block, as `ufw deny` (DROP) or a REJECT rule would."""
        rule = ["INPUT", "-p", "tcp", "--dport", str(port), "-j", target]
        subprocess.run(self.in_namespace(["iptables", "-I", *rule]), check=True)
        try:
            yield
        finally:
            subprocess.run(self.in_namespace(["iptables", "-D", *rule]), check=False)

    def sleepy(self, *, wakes: bool = True, returns: bool = False) -> simsleep.Sleeper:
        """Make the running node a machine that sleeps and wakes on LAN, for a `with` block (tests/simsleep.py):
        the Sleeper gives its sleep command, counts sleeps and wakes, records the wake packets and waits. At
        the block's end its listener stops and a node left asleep wakes. `wakes=False`: a magic packet never
        wakes it; `returns=True`: the sleep command exits 0 before the node sleeps (else its connection drops)."""
        if not self.is_running:
            raise SimClusterError(f"{self.name} must run before it can sleep")
        return simsleep.Sleeper(self, self._sshd_dir, wakes=wakes, returns=returns,
                                sleep=lambda keep: self.kill(keep=keep), wake=self.start).start()

    def drop_wake_packets_from(self, address: str = simnet.BRIDGE_ADDRESS) -> contextlib.AbstractContextManager:
        """For a `with` block the node drops UDP to its wake ports (9, 7) from `address` (by default the
        controller's, this machine's bridge address) in its own iptables: Wake-on-LAN only through another node."""
        return simsleep.dropping_wake_packets(self, address)

    def limited_broadcast_route(self) -> contextlib.AbstractContextManager:
        """For a `with` block the node's packets to 255.255.255.255 go out its eth0 (a node has no default
        route, so they fail otherwise): a relay that wakes others with `wakeonlan`'s default address."""
        return simsleep.limited_broadcast_route(self)

    def in_namespace(self, argv: list[str]) -> list[str]:
        """argv that runs `argv` in the node's network namespace (e.g. its own iptables)."""
        return ["ip", "netns", "exec", self._namespace, *argv]

    @contextlib.contextmanager
    def listening(self) -> Iterator[int]:
        """Hold a TCP port open at the node's address for the block; yields the port."""
        script = ("import socket, sys; s = socket.create_server((sys.argv[1], 0)); "
                  "print(s.getsockname()[1], flush=True); sys.stdin.read()")
        proc = subprocess.Popen(self.in_namespace([sys.executable, "-c", script, self.address]),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            yield int(proc.stdout.readline())
        finally:
            proc.stdin.close()
            proc.wait(timeout=10)
            proc.stdout.close()

    def regenerate_host_key(self) -> str:
        """Replace the host key on disk; takes effect at the next restart(). Returns the new key."""
        generate_ed25519_key(self.host_key_path, f"simnode-{self.name}")
        return self.host_public_key

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        return f"<SimNode {self.name} {self.address}:{self.port} {state}>"


def _set_env_word(name: str, value: str) -> str:
    """NAME=VALUE as one word of sshd_config's SetEnv: in double quotes when it holds a space."""
    word = f"{name}={value}"
    if '"' in word or "\\" in word or "\n" in word:
        raise SimClusterError(f"session_env: sshd_config cannot hold {word!r}")
    return f'"{word}"' if any(char.isspace() for char in word) else word


def stop_all() -> list[str]:
    """Stop every node this process started and has not stopped; return their names.

    The safety net behind close(): registered with atexit, and called by conftest at the end of
    the session, where a non-empty result means some test forgot to stop its cluster.
    """
    leaked = list(_RUNNING.values())
    for node in leaked:
        node.stop()
    return [f"{node.name}@{node.address}:{node.port}" for node in leaked]


def _publish_ssh_configs() -> None:
    """Point homegpu (this process and what it starts) at the running clusters' ssh configs."""
    if _SSH_CONFIGS:
        os.environ[SSH_CONFIG_VAR] = os.pathsep.join(_SSH_CONFIGS)
    else:
        os.environ.pop(SSH_CONFIG_VAR, None)


atexit.register(stop_all)


# -- the cluster -----------------------------------------------------------------------------------


class SimCluster:
    """`count` SimNodes at 10.213.0.<first_host>..., a client key pair, known_hosts and ssh config.

    Use as a context manager or call start()/close(). close() stops only the nodes it started,
    deletes their namespaces and removes only its own temp directory. `mbit` shapes every link
    (None: unshaped). Node aliases are the node names in the cluster named "testcluster" and
    "<cluster name>-<node name>" in the others, so that several clusters can share one process.
    """

    def __init__(self, count: int = 3, *, first_host: int = 2, name: str = "testcluster",
                 extra_path_nodes: Iterable[str] = (), root: Path | None = None,
                 mbit: int | None = simnet.DEFAULT_MBIT) -> None:
        require_root_tools()
        self.name = name
        self.mbit = mbit
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="homegpu-sim-")) if root is None else Path(root)
        self.nodes: list[SimNode] = []
        try:
            self._prepare(count, first_host, set(extra_path_nodes))
        except BaseException:
            self.close()
            raise

    def _prepare(self, count: int, first_host: int, wanted_extra: set[str]) -> None:
        """Keys, known_hosts and ssh config locations and the (not yet started) nodes."""
        self.work_dir = self.root / "work"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.client_key_path = self.root / "client_key"
        self.client_public_key = generate_ed25519_key(self.client_key_path, "homegpu-test-client")
        self.authorized_keys_path = self.root / "authorized_keys"
        self.authorized_keys_path.write_text(self.client_public_key + "\n")
        self.known_hosts_path = self.root / "known_hosts"
        self.ssh_config_path = self.root / "ssh_config"
        for i in range(count):
            self.add_node(f"node{i + 1}", first_host + i, extra_path=f"node{i + 1}" in wanted_extra)

    def add_node(self, name: str, host: int, node_class: type[SimNode] = SimNode, **options: Any) -> SimNode:
        """Add a (not yet started) node at 10.213.0.`host`; start() starts it with the others. Its ssh
        alias is `alias` when given, else NAME (or CLUSTER-NAME outside the test cluster)."""
        alias = options.pop("alias", None) or (name if self.name == "testcluster" else f"{self.name}-{name}")
        node = node_class(name, host, self.root, self.authorized_keys_path, alias=alias, mbit=self.mbit,
                          **options)
        self.nodes.append(node)
        return node

    def start(self) -> SimCluster:
        """Start every node, write known_hosts and the ssh config; on failure close what did start."""
        try:
            for node in self.nodes:
                node.start()
        except BaseException:
            self.close()
            raise
        self.write_known_hosts()
        self.write_ssh_config()
        if str(self.ssh_config_path) not in _SSH_CONFIGS:
            _SSH_CONFIGS.append(str(self.ssh_config_path))
            _publish_ssh_configs()
        return self

    def close(self) -> None:
        """Stop every node (and all its processes), delete their namespaces, remove the temp dir."""
        if str(getattr(self, "ssh_config_path", "")) in _SSH_CONFIGS:
            _SSH_CONFIGS.remove(str(self.ssh_config_path))
            _publish_ssh_configs()
        for node in self.nodes:
            node.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def node(self, name: str) -> SimNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def pids(self) -> set[int]:
        """Every live process of every node."""
        return set().union(*(node.pids() for node in self.nodes))

    def write_known_hosts(self) -> Path:
        """(Re)write known_hosts from the nodes' current host keys.

        Not called by regenerate_host_key(): tests of host key changes need the old entry kept.
        """
        self.known_hosts_path.write_text("".join(node.known_hosts_line + "\n" for node in self.nodes))
        return self.known_hosts_path

    def write_ssh_config(self) -> Path:
        """One `Host` alias per node, as a user's ~/.ssh/config names their machines."""
        blocks = []
        for node in self.nodes:
            lines = [f"Host {node.alias}", f"HostName {node.address}", f"Port {node.port}", "User root",
                     f"IdentityFile {self.client_key_path}", "IdentitiesOnly yes",
                     f"UserKnownHostsFile {self.known_hosts_path}"]
            if node.jump is not None:
                lines.append(f"ProxyJump {node.jump.alias}")
            blocks.append("\n    ".join(lines) + "\n")
        self.ssh_config_path.write_text("\n".join(blocks))
        return self.ssh_config_path

    def ssh_argv(self, node: SimNode, *command: str) -> list[str]:
        """argv for the system ssh client to run `command` on `node`, strictly checking its key."""
        return [
            "ssh", "-F", "/dev/null", "-i", str(self.client_key_path), "-p", str(node.port),
            "-o", "IdentitiesOnly=yes", "-o", f"UserKnownHostsFile={self.known_hosts_path}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", f"root@{node.address}", *command,
        ]

    def cluster_dict(self, runtime: str = "process", *, node_overrides: Mapping[str, Mapping] | None = None,
                     jobs: Mapping[str, Mapping] | None = None, **overrides: Any) -> dict:
        """The cluster.toml content as a dict. `overrides` replace [cluster] keys (None deletes
        one), `node_overrides` maps a node name to keys to replace in its [[nodes]] table.

        Nodes are named by their ssh alias, with no `address` and the default work dir: user, key
        and address come from the ssh config, as for a user. Docker nodes are the exception: this
        machine's one engine runs their containers (the note on Docker below says why), so they
        take DOCKER_NODE_ADDRESS and name their work dir by its path on this machine, unless they
        have an engine of their own (tests/simdocker.py): then they are written as any node.
        """
        cluster = {
            "name": self.name,
            "known_hosts": str(self.known_hosts_path),
            "connect_timeout": 5.0,
            "keepalive_interval": 1.0,
            "keepalive_count_max": 3,
            "stats_interval": 1.0,
        }
        _apply(cluster, overrides)
        nodes = []
        for node in self.nodes:
            table = {"name": node.name, "host": node.alias, "runtime": runtime}
            changes = (node_overrides or {}).get(node.name, {})
            _apply(table, changes)
            if table["runtime"] == "docker" and node.engine is None:
                docker_keys = {"address": DOCKER_NODE_ADDRESS, "work_dir": str(node.work_dir)}
                table.update({key: value for key, value in docker_keys.items() if key not in changes})
            nodes.append(table)
        data: dict[str, Any] = {"cluster": cluster, "nodes": nodes}
        if jobs:
            data["jobs"] = {name: dict(table) for name, table in jobs.items()}
        return data

    def write_cluster_toml(self, path: str | Path, runtime: str = "process", **overrides: Any) -> Path:
        """Write a homegpu cluster.toml for these nodes (see cluster_dict for the overrides)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(tomli_w.dumps(self.cluster_dict(runtime, **overrides)))
        return path


@contextlib.contextmanager
def own_cluster(count: int, first_host: int, **options: Any) -> Iterator[SimCluster]:
    """A SimCluster of a test's own (SimCluster's arguments): started, closed, and checked to leave no process of
    its nodes running."""
    cluster = SimCluster(count, first_host=first_host, **options).start()
    seen = cluster.pids()
    try:
        yield cluster
        seen |= cluster.pids()
    finally:
        cluster.close()
    leftover = alive(seen) | cluster.pids()
    assert not leftover, f"simulated nodes left processes running: {sorted(leftover)}"


def _apply(table: dict, overrides: Mapping[str, Any]) -> None:
    for key, value in overrides.items():
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value


# -- Docker ----------------------------------------------------------------------------------------
#
# Nodes share this machine's one Docker engine unless a test gives them one of their own
# (tests/simdocker.py, own_engines). Nodes on the shared engine keep this machine's network and
# paths: their containers (--network host) share this machine's network stack, where workers of
# several nodes reach each other on loopback with consecutive ports (as homegpu plans for workers
# sharing a machine); cluster_dict gives them that address and their work dir by its path here.
DOCKER_NODE_ADDRESS = "127.0.0.1"


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float) -> None:
    """Read proc's unbuffered stdout until a line contains `text`; SimClusterError after `timeout` s."""
    deadline, seen = time.monotonic() + timeout, []
    while (left := deadline - time.monotonic()) > 0 and select.select([proc.stdout], [], [], left)[0]:
        line = proc.stdout.readline().decode(errors="replace")  # unbuffered: reads up to \n only
        if not line:
            break  # the process closed its output: it exited
        if text in line:
            return
        seen.append(line.strip())
    raise SimClusterError(f"{proc.args[0]} never printed {text!r}; it printed: {' | '.join(seen)}")


def _stop_process(proc: subprocess.Popen, grace: float) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- iperf3 ----------------------------------------------------------------------------------------


def iperf3_between(server: SimNode, client: SimNode, seconds: int = 1, iperf3: str = "iperf3") -> dict:
    """Run one iperf3 test from node `client` to node `server`, each in its namespace; return the JSON."""
    port = 5201
    # --forceflush: into a pipe iperf3 would block-buffer its "Server listening" line forever.
    # bufsize=0: select() must see every unread byte, none may hide in a Python buffer.
    srv = subprocess.Popen(server.in_namespace([iperf3, "-s", "-1", "--forceflush", "-B", server.address,
                                                "-p", str(port)]),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
    try:
        _wait_for_line(srv, "Server listening", 10.0)
        result = subprocess.run(
            client.in_namespace([iperf3, "-c", server.address, "-p", str(port), "-B", client.address,
                                 "-J", "-t", str(seconds)]),
            capture_output=True, text=True, timeout=seconds + 30)
        report = json.loads(result.stdout or "{}")
        if result.returncode != 0 or "error" in report or "end" not in report:
            raise SimClusterError(f"iperf3 client failed: {report.get('error') or result.stderr.strip()}")
        return report
    finally:
        _stop_process(srv, grace=5.0)
        srv.stdout.close()
