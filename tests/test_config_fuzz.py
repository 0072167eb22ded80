"""`homegpu check` on hostile cluster files: exit 0, or one `homegpu: error:` line and exit 2.

A seeded mutator (no extra dependency, the same cases every run) builds several hundred files from
the repository's example cluster.toml: every value replaced by hostile ones (NaN, inf, integers of
thousands of digits, deep nesting, control characters, wrong types), deep nesting of arrays, inline
tables and tables, a UTF-8 byte-order mark, binary junk, duplicate tables, and random edits of
lines and characters. Each goes through the real CLI entry point in-process; an exception escaping
`main` is what a user would see as a traceback, and fails the test.

HOMEGPU_FUZZ_SEED=N runs another seed's random part (the structured cases stay the same).
"""

from __future__ import annotations

import io
import os
import random
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from homegpu.tui.cli.main import main

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = (REPO / "cluster.toml").read_text(encoding="utf-8")
SEED = int(os.environ.get("HOMEGPU_FUZZ_SEED", "12"))
MIN_CASES = 300

BIG = "9" * 5000  # past Python's 4,300-digit limit for int <-> str

# TOML values a user (or a bad editor, or a fuzzer) could put after any `key =`
HOSTILE_VALUES = [
    "nan", "-inf", "5e-324", "1e308", "0", "-1", "65536", "true", BIG, "0x" + "f" * 5000,
    '"x\\ny"', '"' + "a" * 5000 + '"', "[" * 3000 + "]" * 3000, "{" + " a = {" * 2000 + "}" * 2001,
    '["a", 1, 2.5, [3]]', '{ "A\\nB" = "1" }',
]

_ASSIGNMENT = re.compile(r"^(\s*[A-Za-z_]+\s*=\s*).+$")


def run_check(path: Path) -> tuple[int, str, str]:
    """`homegpu --config PATH check` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["--config", str(path), "check"])
    return code, out.getvalue(), err.getvalue()


def value_mutations() -> list[tuple[str, bytes]]:
    """Each `key = value` line of the example with its value replaced by each hostile value."""
    lines = EXAMPLE.split("\n")
    cases = []
    for number, line in enumerate(lines):
        match = _ASSIGNMENT.match(line)
        if not match or line.lstrip().startswith("#"):
            continue
        key = line.split("=")[0].strip()
        for index, value in enumerate(HOSTILE_VALUES):
            mutated = lines[:number] + [match.group(1) + value] + lines[number + 1:]
            cases.append((f"value-L{number + 1}-{key}-{index}", "\n".join(mutated).encode()))
    return cases


def deep(depth: int) -> list[tuple[str, bytes]]:
    """Arrays, inline tables, tables and dotted keys nested `depth` levels."""
    node = '[[nodes]]\nname = "a"\nhost = "h"\n'
    return [(f"{label}-{depth}", text.encode()) for label, text in [
        ("array", "x = " + "[" * depth + "]" * depth + "\n" + node),
        ("inline", "x = " + "{ a = " * depth + "1" + " }" * depth + "\n" + node),
        ("table", node + "[" + ".".join(["t"] * depth) + "]\n"),
        ("array-table", node + "[[" + ".".join(["t"] * depth) + "]]\n"),
        ("dotted", ".".join(["d"] * depth) + " = 1\n" + node),
        ("env", node + "[jobs.j]\nenv = " + "{ A = " * depth + '"1"' + " }" * depth + "\n"),
        ("tags", node + "tags = " + "[" * depth + "]" * depth + "\n"),
    ]]


def structured_cases() -> list[tuple[str, bytes]]:
    """Deep nesting, byte-order marks, encodings, duplicate tables, odd keys, empty files."""
    example = EXAMPLE.encode()
    node = '[[nodes]]\nname = "a"\nhost = "h"\n'
    cases = [case for depth in (10, 100, 400, 1000, 5000) for case in deep(depth)]
    cases += [
        ("bom", b"\xef\xbb\xbf" + example),
        ("bom-twice", b"\xef\xbb\xbf\xef\xbb\xbf" + example),
        ("utf16", EXAMPLE.encode("utf-16")),
        ("latin1", "# caf\xe9\n".encode("latin-1") + example),
        ("nul", example + b"\x00"),
        ("empty", b""),
        ("blank", b"\n\n   \n"),
        ("comments-only", b"# nothing\n"),
        ("dup-cluster", example + b'\n[cluster]\nname = "again"\n'),
        ("dup-job", example + b'\n[jobs.cifar]\nepochs = 2\n'),
        ("dup-key", example.replace(b'name = "home"', b'name = "home"\nname = "home"')),
        ("nodes-table-and-array", b"nodes = []\n" + example),
        ("jobs-array", example + b"\n[[jobs]]\nx = 1\n"),
        ("cluster-array", b"[[cluster]]\n" + node.encode()),
        ("newline-key", node.encode() + b'"a\\nb" = 1\n'),
        ("newline-job", node.encode() + b'[jobs."x\\ny"]\n'),
        ("newline-name", b'[cluster]\nname = "home\\n"\n' + node.encode()),
        ("newline-env-key", node.encode() + b'[jobs.j]\nenv = { "A\\n" = "1" }\n'),
        ("newline-image", node.encode() + b'[jobs.j]\nimage = "a/b\\n"\n'),
        ("newline-tag", node.encode() + b'tags = ["gpu\\n"]\n'),
        ("huge-key", node.encode() + b"k" * 100_000 + b" = 1\n"),
        ("huge-job-port", node.encode() + b"[jobs.j]\nport = 0x" + b"f" * 5000 + b"\n"),
        ("huge-int-top", b"x = " + BIG.encode() + b"\n" + node.encode()),
        ("port-65535-two-workers", node.encode() + b"[jobs.j]\nport = 65535\nworkers_per_node = 2\n"),
        ("many-nodes", "".join(f'[[nodes]]\nname = "n{i}"\nhost = "h{i}"\n' for i in range(300)).encode()),
    ]
    return cases


def random_cases(seed: int, count: int = 140) -> list[tuple[str, bytes]]:
    """Line and character edits of the example, and binary junk, from a seeded generator."""
    rng = random.Random(seed)
    alphabet = '[]{}="\'.,#\\\n\t 0123456789abcxyz-+_:\x00\x7f\u00e9\u2028'
    cases = []
    for index in range(count):
        lines = EXAMPLE.split("\n")
        kind = index % 7
        if kind == 0:
            del lines[rng.randrange(len(lines))]
        elif kind == 1:
            at = rng.randrange(len(lines))
            lines.insert(at, lines[rng.randrange(len(lines))])
        elif kind == 2:
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
        text = "\n".join(lines)
        if kind == 3:
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(len(text))
                text = text[:at] + rng.choice(alphabet) + text[at:]
        elif kind == 4:
            at = rng.randrange(len(text))
            text = text[:at] + text[at + rng.randint(1, 20):]
        elif kind == 5:
            text = text[:rng.randrange(len(text))]
        data = text.encode()
        if kind == 6:
            junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
            at = rng.randrange(len(data))
            data = data[:at] + junk + data[at:] if index % 2 else junk
        cases.append((f"random-{seed}-{index}-kind{kind}", data))
    return cases


CATEGORIES = {
    "values": value_mutations,
    "structure": structured_cases,
    "random": lambda: random_cases(SEED),
}


def test_there_are_enough_cases():
    cases = [data for build in CATEGORIES.values() for _, data in build()]
    assert len(set(cases)) >= MIN_CASES


@pytest.mark.parametrize("category", CATEGORIES)
def test_check_exits_0_or_one_error_line(tmp_path, category):
    """Every case of the category: exit 0 with the cluster printed, or exit 2 with one short line."""
    path = tmp_path / "cluster.toml"
    failures = []
    for name, data in CATEGORIES[category]():
        path.write_bytes(data)
        try:
            code, out, err = run_check(path)
        except BaseException as exc:  # noqa: BLE001 - what a user would see as a traceback
            failures.append(f"{name}: traceback {type(exc).__name__}: {str(exc)[:100]}")
            continue
        if code == 0:
            good = err == "" and out.startswith(f"{path}: cluster ")
        else:
            good = (code == 2 and out == "" and err.startswith(f"homegpu: error: {path}")
                    and err.count("\n") == 1 and len(err) < 2000)
        if not good:
            failures.append(f"{name}: exit {code}, stderr {err[:300]!r}")
    assert not failures, f"{len(failures)} cases failed:\n" + "\n".join(failures[:40])


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "cluster.toml"
    path.write_bytes(b"\xef\xbb\xbf" + EXAMPLE.encode())
    code, out, err = run_check(path)
    assert (code, err) == (0, "")
    assert "desktop" in out and "cifar" in out


@pytest.mark.parametrize("line, value, key", [
    ("keepalive_interval = 5.0", "nan", "[cluster].keepalive_interval"),
    ("keepalive_interval = 5.0", "inf", "[cluster].keepalive_interval"),
    ("connect_timeout = 10.0", "-inf", "[cluster].connect_timeout"),
    ("stats_interval = 1.0", "5e-324", "[cluster].stats_interval"),
    ("keepalive_count_max = 3", BIG, "[cluster].keepalive_count_max"),
    ("stall_timeout = 300.0", "nan", "[jobs.cifar].stall_timeout"),
    ("stall_timeout = 300.0", "1e308", "[jobs.cifar].stall_timeout"),
    ("max_restarts = 3", "100000", "[jobs.cifar].max_restarts"),
    ("epochs = 20", BIG, "[jobs.cifar].epochs"),
    ("batch_size = 128", "0x" + "f" * 5000, "[jobs.cifar].batch_size"),
    ("port = 2222", BIG, "[[nodes]] #2.port"),
    ("port = 23456", "65535\nworkers_per_node = 2", "[jobs.mine].port"),
    ("epochs = 20", "20\nworkers_per_node = 100000", "[jobs.cifar].workers_per_node"),
], ids=lambda item: item[:24])
def test_wrong_numbers_are_refused_naming_the_key(tmp_path, line, value, key):
    """Values the loader once accepted (NaN, 5e-324, a worker on port 65536) or crashed on."""
    assert line in EXAMPLE
    path = tmp_path / "cluster.toml"
    path.write_text(EXAMPLE.replace(line, line.split("=")[0] + "= " + value), encoding="utf-8")
    code, out, err = run_check(path)
    assert code == 2 and err.count("\n") == 1, err[:2000]
    assert f": {key}: " in err and out == ""


@pytest.mark.parametrize("text", [
    "x = " + "[" * 5000 + "]" * 5000 + "\n",
    "x = " + "{ a = " * 5000 + "1" + " }" * 5000 + "\n",
    "x = " + BIG + "\n",
], ids=["array", "inline-table", "integer"])
def test_deep_nesting_and_huge_integers_name_the_file_and_line(tmp_path, text):
    path = tmp_path / "cluster.toml"
    path.write_text('[[nodes]]\nname = "a"\nhost = "h"\n' + text, encoding="utf-8")
    code, _, err = run_check(path)
    assert code == 2 and err.startswith(f"homegpu: error: {path}:4: ") and err.count("\n") == 1, err[:2000]
