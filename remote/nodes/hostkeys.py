"""known_hosts: what it says about a host, and adding a key the user chose to trust.

Keys are only ever appended: a changed key is refused, never overwritten (the user removes the old
line with `ssh-keygen -R` after checking why it changed).
"""

from __future__ import annotations

import os
from pathlib import Path

import asyncssh


def known_hosts_path(path: str) -> Path:
    return Path(os.path.expanduser(path))


def load_known_hosts(path: str) -> asyncssh.SSHKnownHosts:
    """The file's entries; a missing file is an empty list (nothing trusted yet), not an error."""
    file = known_hosts_path(path)
    if not file.exists():
        return asyncssh.import_known_hosts("")
    return asyncssh.read_known_hosts(str(file))


def host_pattern(host: str, port: int) -> str:
    """The name OpenSSH writes for a host: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: asyncssh.SSHKey) -> str:
    return key.get_fingerprint("sha256")


def has_keys_for(path: str, host: str, addr: str, port: int) -> bool:
    """Whether known_hosts already holds any key for this host (so a mismatch means it changed)."""
    host_keys, ca_keys, *_ = load_known_hosts(path).match(host, addr, port)
    return bool(host_keys or ca_keys)


def known_hosts_line(host: str, port: int, key: asyncssh.SSHKey) -> str:
    key_text = key.export_public_key("openssh").decode().split()
    return f"{host_pattern(host, port)} {key_text[0]} {key_text[1]}\n"


def append_trusted(path: str, host: str, port: int, key: asyncssh.SSHKey) -> Path:
    """Add one line for `host` to known_hosts, creating the file (0600, in a 0700 dir) if needed."""
    file = known_hosts_path(path)
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "a", encoding="ascii") as out:
        out.write(known_hosts_line(host, port, key))
    return file
