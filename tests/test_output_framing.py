"""The marker that sets a talking login shell's text apart from a command's output, the commands that
stand in for SFTP, and how doctor words a talking shell: pure functions, no node needed (the LAN tests in
test_login_shell.py run them against a real sshd whose ~/.bashrc prints)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from homegpu.remote.doctor.judge import shell_check
from homegpu.remote.nodes.exec_files import find_argv, parse_find
from homegpu.remote.nodes.login_shell import banner_line, talking_shell
from homegpu.remote.nodes.transport import OUTPUT_MARK, framed, split_banner


def through_a_talking_shell(argv: list[str]) -> subprocess.CompletedProcess:
    """argv as sshd hands it to a login shell whose rc file echoes first: `sh -c 'echo …; COMMAND'`."""
    return subprocess.run(["sh", "-c", f"echo Welcome; echo oops >&2; {framed(argv)}"], capture_output=True)


def test_the_shells_text_is_set_apart_on_both_streams_and_the_exit_status_is_the_commands():
    result = through_a_talking_shell(["sh", "-c", 'printf "out\\n"; printf "err\\n" >&2; exit 3', "x"])
    assert result.returncode == 3
    assert split_banner(result.stdout) == (b"Welcome\n", b"out\n")
    assert split_banner(result.stderr) == (b"oops\n", b"err\n")


def test_values_reach_the_command_unread_by_the_shell():
    hostile = "$(touch /tmp/pwned); `id` 'quoted' \"double\""
    result = through_a_talking_shell(["printf", "%s", hostile])
    assert split_banner(result.stdout)[1] == hostile.encode()


@pytest.mark.parametrize("data, expected", [
    (f"{OUTPUT_MARK}\nanswer\n".encode(), (b"", b"answer\n")),
    (f"no newline{OUTPUT_MARK}\nanswer".encode(), (b"no newline", b"answer")),
    (b"the shell exited before the command", (b"", b"the shell exited before the command")),
    (f"{OUTPUT_MARK}\n{OUTPUT_MARK}\n".encode(), (b"", f"{OUTPUT_MARK}\n".encode())),  # the command's own
])
def test_split_banner(data, expected):
    assert split_banner(data) == expected


def test_find_lists_regular_files_and_prunes_skipped_names(tmp_path):
    (tmp_path / "a" / ".git").mkdir(parents=True)
    (tmp_path / "a" / ".git" / "x").write_text("x")
    (tmp_path / "a" / "b.txt").write_text("hello")
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / "old").write_text("old")
    (tmp_path / "name with\nnewline").write_text("12")
    output = subprocess.run(find_argv(str(tmp_path), frozenset({".git", "backup"})), capture_output=True,
                            text=True, check=True).stdout
    listing = parse_find(output)
    assert {path: size for path, (size, _) in listing.items()} == {"a/b.txt": 5, "name with\nnewline": 2}
    assert all(mtime > 0 for _, mtime in listing.values())


def test_find_of_a_missing_folder_is_empty(tmp_path):
    result = subprocess.run(find_argv(str(tmp_path / "gone"), frozenset()), capture_output=True, text=True)
    assert result.returncode == 0 and parse_find(result.stdout) == {}
    assert shlex.join(find_argv("/x", frozenset())).count("-prune") == 0


def test_doctor_words_a_talking_shell_with_its_fix_and_a_silent_one_plainly():
    banner = "\nWelcome to the closet box, noisy!\nsecond line\n"
    row = shell_check("closet", banner, "Max packet size exceeded")
    assert row.ok is False
    assert row.detail == ("its login shell prints `Welcome to the closet box, noisy!` for non-interactive commands, "
                          "which breaks SFTP through the distribution's sftp-server (homegpu sets it aside); no SFTP "
                          "(Max packet size exceeded), so homegpu moves files with commands")
    assert "[[ $- == *i* ]] || return" in row.fix
    assert shell_check("n", "", "").detail == "prints nothing for non-interactive commands"
    assert shell_check("n", "", "").ok is True
    assert shell_check("n", "", "", failure="cannot create x: denied").ok is False
    assert talking_shell("  \n") == "" and len(banner_line("x" * 500)) == 80
