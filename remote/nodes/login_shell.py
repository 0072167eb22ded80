"""A node's login shell that prints for non-interactive commands, in words for doctor and preflight.

bash reads ~/.bashrc for every command sshd hands it, so an `echo` above the file's interactive guard
(or a distribution's .bashrc without one) prints before each command. homegpu sets that text aside
(transport.OUTPUT_MARK) and moves files by commands where it breaks SFTP; scp, rsync and Debian's
sftp-server still break on it, so it is named once, with its fix.
"""

from __future__ import annotations

SHELL_FIX = ("Move that line under an interactive guard in the node's ~/.bashrc (or the file that prints it): "
             "`[[ $- == *i* ]] || return` above it; or use `Subsystem sftp internal-sftp` in its sshd_config")
_LONGEST = 80


def banner_line(banner: str) -> str:
    """The first line the shell printed, cut to a readable length."""
    line = next((line.strip() for line in banner.splitlines() if line.strip()), "")
    return line if len(line) <= _LONGEST else line[:_LONGEST - 1] + "…"


def talking_shell(banner: str) -> str:
    """What the shell does, in one clause; "" for a silent shell."""
    if not banner.strip():
        return ""
    return (f"its login shell prints `{banner_line(banner)}` for non-interactive commands, which breaks "
            "SFTP through the distribution's sftp-server (homegpu sets it aside)")
