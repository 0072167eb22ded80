"""Open a verified SSH connection to one node, or say precisely why it cannot be opened.

asyncssh honours the ssh config (Host aliases, HostName, User, Port, IdentityFile, ProxyJump,
ServerAlive*) where a value is not given explicitly, so only what cluster.toml sets is passed. What
it lacks is a way to tell an unknown host key from a changed one and to show the fingerprint: a
client object records the key it was asked to accept, and known_hosts decides which.

The ssh config files (ssh_config_files) are parsed here, once per file version and host, and asyncssh is
handed the result for every connection, a node's or its gateway's: it reads ~/.ssh/config by itself only in
connect(), not when `check` asks it where a node's connection goes, it skips one it cannot read, and named
to it the files are parsed again for every connection. So `check` and a connection read the same files,
and a file that cannot be read or parsed is one line
(SshConfigError) in `check` and in the node's state, never a silent fallback to port 22 and the login
name. HOMEGPU_SSH_CONFIG names other files to read instead of ~/.ssh/config (os.pathsep between
several; the first value found for an option wins, as in OpenSSH): for a cluster whose aliases live
elsewhere, and for the tests' simulated LAN.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from homegpu.remote.config import DEFAULT_CONFIG_NAME, EMBEDDED_DEFAULT, ClusterSpec, NodeSpec
from homegpu.remote.nodes import hostkeys
from homegpu.remote.nodes.transport import LocalTransport, NodeTransport, SshTransport, TransportError, cause


SSH_CONFIG_VAR = "HOMEGPU_SSH_CONFIG"
USER_SSH_CONFIG = "~/.ssh/config"  # where ssh and asyncssh look without HOMEGPU_SSH_CONFIG


class NodeError(Exception):
    """A node could not be reached; the message says why and what to do."""

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        super().__init__(message)


class Unreachable(NodeError):
    pass


class AuthFailed(NodeError):
    pass


class SshConfigError(NodeError):
    """An ssh config file cannot be read or asyncssh refuses it: "ssh config: " and which file and why."""


@dataclass(frozen=True)
class OfferedKey:
    """The host key a server showed us, with where it came from (after ~/.ssh/config)."""

    host: str
    addr: str
    port: int
    key: asyncssh.SSHKey

    @property
    def fingerprint(self) -> str:
        return hostkeys.fingerprint(self.key)


class HostKeyUnknown(NodeError):
    def __init__(self, node: str, offered: OfferedKey, trust_command: str, whose: str = "the node's") -> None:
        self.offered = offered
        super().__init__(node, f"host key for {offered.host} port {offered.port} is not in known_hosts "
                               f"({offered.fingerprint}); if that is {whose} key, run: {trust_command}")


class HostKeyChanged(NodeError):
    def __init__(self, node: str, offered: OfferedKey, known_hosts: str) -> None:
        self.offered = offered
        super().__init__(node, f"HOST KEY CHANGED for {offered.host} port {offered.port}: it now offers "
                               f"{offered.fingerprint}, which does not match {known_hosts}. Refusing to connect. "
                               "If the node was reinstalled, check the new key and remove the old line with "
                               f"`ssh-keygen -f {known_hosts} -R {hostkeys.host_pattern(offered.host, offered.port)}`")


class _KeyRecorder(asyncssh.SSHClient):
    """Refuses any key known_hosts does not vouch for, remembering it for the error message."""

    def __init__(self) -> None:
        self.offered: OfferedKey | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.offered = OfferedKey(host, addr, port, key)
        return False


def connect_wait(cluster: ClusterSpec, extra: float) -> float:
    """Seconds to wait for nodes to connect: the SSH connect timeout plus `extra` for what follows
    (the handshake, a first command or stats line). The one place such waits are reckoned."""
    return cluster.ssh.connect_timeout + extra


def trust_command(cluster: ClusterSpec, node: NodeSpec) -> str:
    """The command that trusts `node`'s key, naming the cluster file unless it is the one used by default here."""
    config = "" if _is_default_config(cluster.source) else f" --config {cluster.source}"
    return f"homegpu{config} trust {node.name}"


def _is_default_config(source: str) -> bool:
    if source in (DEFAULT_CONFIG_NAME, EMBEDDED_DEFAULT):
        return True
    try:
        return Path(source).resolve() == Path(DEFAULT_CONFIG_NAME).resolve()
    except OSError:
        return False


def connect_options(cluster: ClusterSpec, node: NodeSpec) -> dict[str, Any]:
    """asyncssh.connect keyword arguments: only what cluster.toml sets, so the ssh config fills the rest."""
    return {**_cluster_options(cluster, node.identity_file or cluster.ssh.identity_file),
            **_target_options(cluster, node), "options": _read_ssh_config(cluster, node)}


def _cluster_options(cluster: ClusterSpec, identity: str | None) -> dict[str, Any]:
    """What every connection, a node's or its gateway's, takes from cluster.toml: known_hosts, timeouts, a key."""
    ssh = cluster.ssh
    options: dict[str, Any] = {
        "known_hosts": hostkeys.load_known_hosts(ssh.known_hosts), "connect_timeout": ssh.connect_timeout,
        "keepalive_interval": ssh.keepalive_interval, "keepalive_count_max": ssh.keepalive_count_max,
    }
    if identity:
        options["client_keys"] = [os.path.expanduser(identity)]
    return options


def ssh_config_files() -> list[str]:
    """The ssh config files to read: HOMEGPU_SSH_CONFIG's, else ~/.ssh/config where there is one (even one
    that cannot be read: that is said, not skipped)."""
    named = [os.path.expanduser(path) for path in os.environ.get(SSH_CONFIG_VAR, "").split(os.pathsep) if path]
    if named:
        return named
    default = os.path.expanduser(USER_SSH_CONFIG)
    return [default] if os.path.lexists(default) else []


def _target_options(cluster: ClusterSpec, node: NodeSpec) -> dict[str, Any]:
    """The options that decide where and as whom where cluster.toml sets them: its port and user."""
    options: dict[str, Any] = {}
    if node.port:
        options["port"] = node.port
    user = node.user or cluster.ssh.user
    if user:
        options["username"] = user
    return options


def _read_ssh_config(cluster: ClusterSpec, node: NodeSpec) -> asyncssh.SSHClientConnectionOptions:
    """Where `node`'s connection goes and as whom, read from the ssh config files as connect() reads them.

    Raises:
        SshConfigError: a file cannot be read, or asyncssh refuses it (its line and why).
    """
    options = _target_options(cluster, node)
    return _ssh_config_for(node.name, node.host, options.get("port"), options.get("username"))


def _ssh_config_for(name: str, host: str, port: int | None = None,
                    username: str | None = None) -> asyncssh.SSHClientConnectionOptions:
    """The ssh config files' options for connecting to `host`, parsed once per file version: asyncssh, handed
    them (`options=`), bases a connection on their loaded config and reads no file again, where naming the files
    made it parse them for every connection (a 16-node first screen spent about 80 ms of CPU on it).

    Raises:
        SshConfigError: for node `name`: a file cannot be read, or asyncssh refuses it (its line and why).
    """
    try:
        return _parsed_ssh_config(_stamps(ssh_config_files()), host, port, username)
    except OSError as exc:
        raise SshConfigError(name, f"ssh config: cannot read {exc.filename}: {exc.strerror}") from None
    except (ValueError, asyncssh.Error) as exc:  # asyncssh's ConfigParseError: "FILE line N: why"
        raise SshConfigError(name, f"ssh config: {exc}") from None


def _stamps(paths: list[str]) -> tuple[tuple[str, int, int], ...]:
    """Each file with its modification time and size (-1 where it cannot be read): a changed file is read again."""
    stamps = []
    for path in paths:
        try:
            stat = os.stat(path)
            stamps.append((path, stat.st_mtime_ns, stat.st_size))
        except OSError:
            stamps.append((path, -1, -1))
    return tuple(stamps)


@functools.lru_cache(maxsize=256)  # asked for every node on every connect, by preflight, doctor and the views: a
# 16-node config read 16 × 3 times cost the first screen about 0.3 s of CPU; read once per file version
def _parsed_ssh_config(stamps: tuple[tuple[str, int, int], ...], host: str, port: int | None,
                       username: str | None) -> asyncssh.SSHClientConnectionOptions:
    given = {key: value for key, value in (("port", port), ("username", username)) if value}
    return asyncssh.SSHClientConnectionOptions(host=host, config=[path for path, _, _ in stamps], **given)


async def open_transport(cluster: ClusterSpec, node: NodeSpec) -> NodeTransport:
    """Connect to `node`.

    Raises:
        SshConfigError: an ssh config file cannot be read.
        HostKeyUnknown, HostKeyChanged: known_hosts does not vouch for the offered key.
        AuthFailed: the server refused our keys.
        Unreachable: anything else (refused, timed out, DNS, connection reset ...).
    """
    if node.is_local:
        return LocalTransport()
    _read_ssh_config(cluster, node)  # its one line, where connect() would raise a bare ValueError or OSError
    conn = await _connect(cluster, node)
    transport = SshTransport(conn, open_more=lambda: _connect(cluster, node), python=node.python)
    transport.peer_address = peer_address(conn.get_extra_info("peername"))
    return transport


async def _connect(cluster: ClusterSpec, node: NodeSpec) -> asyncssh.SSHClientConnection:
    """One verified SSH connection to `node` (open_transport's errors). Through its ProxyJump gateway
    when the ssh config names one: the gateway's connection is opened here and verified like any node's
    (cluster.toml's known_hosts; `homegpu trust NODE` records its key), then carries the node's."""
    gateway = _gateway(cluster, node)
    tunnel = await _verified(cluster, node, gateway, _gateway_options(cluster, node, gateway),
                             gateway=True) if gateway else None
    try:
        conn = await _verified(cluster, node, node.host, connect_options(cluster, node), tunnel=tunnel)
    except BaseException:
        if tunnel is not None:
            tunnel.close()
        raise
    if tunnel is not None:
        conn.set_tunnel(tunnel)  # closed with the node's connection
    return conn


async def _verified(cluster: ClusterSpec, node: NodeSpec, host: str, options: dict[str, Any], *,
                    tunnel: asyncssh.SSHClientConnection | None = None, gateway: bool = False,
                    ) -> asyncssh.SSHClientConnection:
    """An SSH connection to `host` whose key known_hosts vouches for, or the NodeError that says why not."""
    recorder = _KeyRecorder()
    where = f"{node.name}'s ProxyJump gateway {host}: " if gateway else ""
    try:
        return await asyncio.wait_for(
            asyncssh.connect(host, client_factory=lambda: recorder, **options, **({"tunnel": tunnel} if tunnel else {})),
            connect_wait(cluster, 1),
        )
    except asyncssh.HostKeyNotVerifiable as exc:
        raise _host_key_error(cluster, node, recorder.offered, exc, gateway=host if gateway else "") from None
    except asyncssh.PermissionDenied:
        user = login_name(cluster, node) if not gateway else "the ssh config's user"
        raise AuthFailed(node.name, f"{where}authentication failed as {user}: it refused our SSH key; "
                                    "check identity_file and its ~/.ssh/authorized_keys") from None
    except (asyncio.TimeoutError, TimeoutError):
        raise Unreachable(node.name, f"{where}no answer from {host} within {cluster.ssh.connect_timeout:g}s; "
                                     "is the machine on and sshd running?") from None
    except (OSError, asyncssh.Error) as exc:
        raise Unreachable(node.name, f"{where}cannot connect to {host}: {_describe(exc)}") from None


def _gateway(cluster: ClusterSpec, node: NodeSpec) -> str:
    """The one ProxyJump gateway the ssh config names for the node, as an ssh destination ("" for none;
    a chain of several is left to asyncssh, which verifies them with the ssh config's known_hosts)."""
    jump = ssh_target(cluster, node).jump
    return "" if "," in jump or jump.lower() == "none" else jump


def _gateway_options(cluster: ClusterSpec, node: NodeSpec, gateway: str) -> dict[str, Any]:
    """`node`'s gateway's connect options: cluster.toml's known_hosts, timeouts and key, the rest from the ssh
    config (its user and port are the gateway's own, not the node's)."""
    return {**_cluster_options(cluster, cluster.ssh.identity_file), "options": _ssh_config_for(node.name, gateway)}


def peer_address(peername: object) -> str | None:
    """The IP address an SSH connection reached (HostName resolved as ssh resolves it), or None
    when there is none to tell (a connection tunnelled through ProxyJump has no socket peer)."""
    if not isinstance(peername, tuple) or not peername:
        return None
    try:
        return str(ipaddress.ip_address(str(peername[0]).split("%", 1)[0]))
    except ValueError:
        return None


async def address_behind_jump(cluster: ClusterSpec, node: NodeSpec, transport: NodeTransport) -> tuple[str, str] | None:
    """For a node reached through a ProxyJump gateway (its connection has no socket peer): the address
    the other nodes reach it by, and where that came from; None when nothing tells.

    The ssh config's HostName when it is an address; else that name resolved on the node (where the
    lab's own DNS or /etc/hosts answers); else the node's source address on its default route.
    """
    target = ssh_target(cluster, node)
    if jump_hostname_address(target):
        return target.host, f"HostName in the ssh config, reached through ProxyJump {target.jump}"
    try:
        resolved = await transport.run(["getent", "ahostsv4", target.host], timeout=10)
        for line in resolved.stdout.splitlines():
            address = line.split()[0] if line.split() else ""
            if _is_address(address) and not ipaddress.ip_address(address).is_loopback:
                return address, f"{target.host} as the node resolves it, reached through ProxyJump {target.jump}"
        route = await transport.run(["ip", "-4", "-o", "route", "get", "192.0.2.1"], timeout=10)
    except TransportError:
        return None
    fields = route.stdout.split()
    if "src" in fields[:-1] and _is_address(source := fields[fields.index("src") + 1]):
        return source, f"the node's own address on its default route, reached through ProxyJump {target.jump}"
    return None


def jump_hostname_address(target: SshTarget) -> bool:
    """Whether the ssh config's HostName is an address: for a node behind ProxyJump, the one the others use."""
    return target.host_from == "ssh config" and _is_address(target.host)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class SshTarget:
    """Where homegpu's SSH connection to a node goes and as whom, each with where it comes from
    ("cluster.toml", "ssh config", "default" or "login name"): what `homegpu check` shows. `problem`:
    why the ssh config could not be read (SshConfigError's line), "" when it was."""

    host: str
    port: int
    user: str
    host_from: str
    port_from: str
    user_from: str
    problem: str = ""
    jump: str = ""  # the ssh config's ProxyJump: the gateway the connection goes through ("" for none)


def ssh_target(cluster: ClusterSpec, node: NodeSpec) -> SshTarget:
    """What asyncssh will use for `node`: cluster.toml's values, else the ssh config's (HostName,
    Port, User, as HOMEGPU_SSH_CONFIG or ~/.ssh/config says), else its defaults. Reads the ssh
    config only; connects nowhere. A config that cannot be read leaves cluster.toml's values and the
    defaults, with `problem` saying why."""
    options = _target_options(cluster, node)
    try:
        resolved = _read_ssh_config(cluster, node)
        config, user, problem = resolved.config, resolved.username, ""
    except SshConfigError as exc:
        config, user, problem = {}, options.get("username") or "your login name", str(exc)
    host, port = config.get("Hostname"), config.get("Port")
    return SshTarget(
        host or node.host, options.get("port") or port or 22, user,
        "ssh config" if host else "cluster.toml", "cluster.toml" if node.port else "ssh config" if port else "default",
        "cluster.toml" if "username" in options else "ssh config" if config.get("User") else "login name", problem,
        str(config.get("ProxyJump") or ""))


def login_name(cluster: ClusterSpec, node: NodeSpec) -> str:
    """The user SSH logs in as: cluster.toml's, else the ssh config's `User`, else the local login."""
    return ssh_target(cluster, node).user


def _host_key_error(cluster: ClusterSpec, node: NodeSpec, offered: OfferedKey | None,
                    exc: Exception, gateway: str = "") -> NodeError:
    jump = ssh_target(cluster, node).jump
    if offered is not None and gateway and not hostkeys.has_keys_for(
            cluster.ssh.known_hosts, offered.host, offered.addr, offered.port):
        return HostKeyUnknown(node.name, offered, trust_command(cluster, node), f"its ProxyJump gateway {gateway}'s")
    if offered is None and "," in jump:  # a chain of gateways: asyncssh opened them with the ssh config alone
        return Unreachable(node.name, f"the host key of {node.host}'s ProxyJump gateway {jump} could not be verified "
                                      f"({exc}); check and record it as ssh does, with `ssh {jump}` once (its key "
                                      "is read from the ssh config's known_hosts files, as ssh reads it)")
    if offered is None:  # e.g. a revoked key or an unusable certificate: nothing to offer for trust
        return Unreachable(node.name, f"host key of {node.host} could not be verified ({exc}); "
                                      f"check {cluster.ssh.known_hosts}")
    if hostkeys.has_keys_for(cluster.ssh.known_hosts, offered.host, offered.addr, offered.port):
        return HostKeyChanged(node.name, offered, cluster.ssh.known_hosts)
    return HostKeyUnknown(node.name, offered, trust_command(cluster, node))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is sshd running, and is the port right?)"
    return cause(exc)


async def fetch_offered_key(cluster: ClusterSpec, node: NodeSpec) -> OfferedKey:
    """The key a node offers, for `homegpu trust`. Raises NodeError when there is nothing to trust."""
    try:
        transport = await open_transport(cluster, node)
    except HostKeyUnknown as exc:
        return exc.offered
    except AuthFailed:
        transport = None
    if transport:
        transport.close()
    raise NodeError(node.name, f"{node.name}'s host key is already trusted in {cluster.ssh.known_hosts}")
