"""gitignore's rules as code sync reads them (remote/jobs/ignore_rules.py): a table of patterns and
paths, then a tree of tricky patterns whose every path is decided by us and by `git check-ignore`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from homegpu.remote.jobs.ignore_rules import IgnoreTree, parse, wildmatch


def ignored(files: dict[str, str | bytes], path: str, is_dir: bool = False) -> bool:
    """Our decision for `path` in a tree whose folders hold the ignore files `files` ({folder: text})."""
    texts = {folder: text.encode() if isinstance(text, str) else text for folder, text in files.items()}
    return IgnoreTree(texts.get).ignored(path, is_dir)


@pytest.mark.parametrize("text, path, is_dir, expected", [
    ("*.log", "a.log", False, True),
    ("*.log", "deep/er/a.log", False, True),  # no slash: a name at any depth
    ("*.log", "a.logx", False, False),
    ("# comment", "# comment", False, False),
    ("\\#hash", "#hash", False, True),  # an escaped '#' is a name
    ("\\!bang", "!bang", False, True),  # an escaped '!' is a name, not a re-include
    ("*.log\n!keep.log", "keep.log", False, False),
    ("*.log\n!keep.log", "other.log", False, True),
    ("!keep.log\n*.log", "keep.log", False, True),  # the last pattern that matches wins
    ("build/", "build", True, True),
    ("build/", "build", False, False),  # a trailing '/': directories only
    ("build/", "src/build", True, True),
    ("build/", "build/out.o", False, True),  # under an ignored folder
    ("/root.txt", "root.txt", False, True),
    ("/root.txt", "sub/root.txt", False, False),  # a leading '/' anchors to the file's folder
    ("doc/frotz", "doc/frotz", False, True),
    ("doc/frotz", "a/doc/frotz", False, False),  # so does a '/' in the middle
    ("foo?", "food", False, True),
    ("foo?", "foo", False, False),
    ("[abc].txt", "b.txt", False, True),
    ("[abc].txt", "d.txt", False, False),
    ("[!abc].txt", "d.txt", False, True),
    ("[^abc].txt", "a.txt", False, False),
    ("[a-c]x", "bx", False, True),
    ("[a-c]x", "dx", False, False),
    ("[]]x", "]x", False, True),  # a ']' first in a set is a member
    ("[[:digit:]]*", "1abc", False, True),
    ("[[:digit:]]*", "abc", False, False),
    ("**/logs", "logs", True, True),
    ("**/logs", "a/b/logs", True, True),
    ("logs/**", "logs/x", False, True),
    ("logs/**", "logs/a/b", False, True),
    ("logs/**", "logs", True, False),  # what is inside, not the folder
    ("a/**/b", "a/b", False, True),
    ("a/**/b", "a/x/y/b", False, True),
    ("a/**/b", "ax/b", False, False),
    ("a/*.py", "a/b.py", False, True),
    ("a/*.py", "a/b/c.py", False, False),  # '*' stays in one folder
    ("a**b", "axxb", False, True),  # '**' not between slashes is a plain '*'
    ("foo**/bar", "foo/x/y/bar", False, True),  # but git compares the literal head apart: then it starts one
    ("**", "any/thing", False, True),
    ("name   ", "name", False, True),  # trailing spaces dropped...
    ("name\\ ", "name ", False, True),  # ...but an escaped one
    ("name\\ ", "name", False, False),
    ("x.txt\r\n", "x.txt", False, True),  # CRLF line ends
    ("\\*star", "*star", False, True),
    ("\\*star", "xstar", False, False),
    ("d??.txt", "dé.txt", False, True),  # '?' is a byte: é is two in UTF-8
    ("d?.txt", "dé.txt", False, False),
    ("data/\n!data/keep.txt", "data/keep.txt", False, True),  # nothing under an ignored folder comes back
    ("data/*\n!data/keep.txt", "data/keep.txt", False, False),
    ("data/*\n!data/keep.txt", "data/other.txt", False, True),
    ("", "anything", False, False),
    ("!", "anything", False, False),
    ("/", "anything", True, False),
])
def test_one_file(text, path, is_dir, expected):
    assert ignored({"": text}, path, is_dir) is expected


@pytest.mark.parametrize("files, path, expected", [
    ({"": "*.tmp", "sub": "!keep.tmp"}, "sub/keep.tmp", False),  # the deeper file wins
    ({"": "*.tmp", "sub": "!keep.tmp"}, "keep.tmp", True),  # and applies to its own folder only
    ({"": "*.tmp", "sub": "!keep.tmp"}, "sub/other.tmp", True),
    ({"sub": "/only.txt"}, "sub/only.txt", True),  # anchored to its own folder
    ({"sub": "/only.txt"}, "sub/deep/only.txt", False),
    ({"sub": "/only.txt"}, "only.txt", False),
    ({"sub": "deep/x"}, "sub/deep/x", True),
    ({"": "data/", "data": "!*"}, "data/x", True),  # an ignored folder's own file is never read
    ({"": b"\xef\xbb\xbfbom.txt"}, "bom.txt", True),  # a UTF-8 byte order mark is not part of the pattern
])
def test_nested_files(files, path, expected):
    assert ignored(files, path) is expected


def test_an_ignored_folders_file_is_not_even_read():
    read = []
    tree = IgnoreTree(lambda folder: read.append(folder) or (b"data/\n" if folder == "" else None))
    assert tree.ignored("data/sub/x", False) and tree.ignored("src/y", False) is False
    assert read == ["", "src"]


def test_patterns_keep_what_git_keeps():
    (log, negated, folder, anchored) = parse(b"*.log\n!keep.log\nbuild/\n/top/x\n# not one\n\n")
    assert (log.glob, log.anchored, log.negated) == (b"*.log", False, False)
    assert (negated.glob, negated.negated) == (b"keep.log", True)
    assert (folder.glob, folder.dir_only, folder.anchored) == (b"build", True, False)
    assert (anchored.glob, anchored.anchored) == (b"top/x", True)


@pytest.mark.parametrize("pattern, text, expected", [
    (b"*", b"a/b", False),  # a '*' stays in one folder
    (b"**/b", b"b", True),
    (b"a/**", b"a/b/c", True),
    (b"a/*/c", b"a/b/c", True),
    (b"a/*/c", b"a/b/x/c", False),
    (b"a**/c", b"a/b/c", False),  # a '**' after a name is a '*'
    (b"[a-", b"a", False),  # an unclosed set matches nothing
    (b"[[:nope:]]", b"a", False),
    (b"[[:alpha]", b"[", True),  # no ":]": a plain '[' in the set
    (b"[!a]", b"/", False),  # nor does any set match a '/'
    (b"ab\\", b"ab", False),  # a trailing backslash matches nothing
])
def test_wildmatch(pattern, text, expected):
    assert wildmatch(pattern, text) is expected


# -- against git itself ---------------------------------------------------------------------------

ROOT_IGNORE = """\
# a comment, then patterns of every kind
\\#literal-hash
\\!literal-bang
*.log
!important.log
build/
/rootonly.txt
docs/generated
*.tmp   \n\
trailing\\ \n\
[abc]x.dat
[!abc]y.dat
[a-c]z.dat
[^0-9]w.dat
[]a]v.dat
[[:upper:]]*.up
[[:digit:]]*.num
**/cache
vendor/**
a/**/deep.txt
q?.txt
d??.txt
\\*star
data/*
!data/keep/
data/keep/*.bin
!data/keep/important.bin
secrets/
!secrets/public.txt
foo/*/bar
qux**/end
*.[oa]
dir_only_name/
**/nested/**/leaf
"""
NESTED_IGNORES = {
    "sub": "!*.log\n/anchored.txt\ninner/\n",
    "sub/deeper": "*.txt\n!keep.txt\n",
    "build": "!*\n",  # inside an ignored folder: never read
    "data/keep": "readme.md\n",
}
FILES = """
a.log important.log sub/x.log sub/anchored.txt sub/deep/anchored.txt sub/inner/f.py sub/deeper/a.txt
sub/deeper/keep.txt sub/deeper/more/b.txt sub/deeper/more/keep.txt build/out.bin src/build/x.c
rootonly.txt src/rootonly.txt docs/generated/api.html x/docs/generated note.tmp #literal-hash
!literal-bang #other ax.dat dx.dat ay.dat dy.dat bz.dat dz.dat 1file.num file1.num cache/c1 lib/cache/c2
lib/cachex vendor/v.py vendor/sub/w.py a/deep.txt a/b/deep.txt a/b/c/deep.txt ab/deep.txt q1.txt q12.txt
dé.txt dx.txt *star xstar data/raw.csv data/keep/a.bin data/keep/important.bin data/keep/readme.md
data/other/z.csv secrets/key.pem secrets/public.txt foo/x/bar foo/x/y/bar foo/bar main.o lib.a code.c
dir_only_name/f file_named/dir_only_name p/nested/q/leaf nested/leaf p/nested/leaf main.py qux/a/b/end
quxx/end x/qux/end aw.dat 1w.dat ]v.dat av.dat bv.dat Ab.up ab.up
""".split() + ["trailing ", "trailing"]


@pytest.fixture
def tricky_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x\n")
    (root / ".gitignore").write_text(ROOT_IGNORE)
    for folder, text in NESTED_IGNORES.items():
        (root / folder / ".gitignore").write_text(text)
    return root


def every_path(root: Path) -> dict[str, bool]:
    """{path relative to root: is a directory} for everything under root."""
    paths = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            paths[path.relative_to(root).as_posix()] = path.is_dir()
    return paths


def git_ignored(root: Path, paths: list[str]) -> set[str]:
    """The paths `git check-ignore` says are ignored, reading nothing of this machine's git setup."""
    env = {**os.environ, "HOME": str(root.parent), "XDG_CONFIG_HOME": str(root.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", str(root)], check=True, env=env)
    result = subprocess.run(["git", "-c", "core.excludesFile=/dev/null", "check-ignore", "--no-index", "--stdin",
                             "-z"], cwd=root, env=env, input="\0".join(paths).encode(), capture_output=True)
    assert result.returncode in (0, 1), result.stderr  # 1: nothing ignored
    return {os.fsdecode(path) for path in result.stdout.split(b"\0") if path}


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_every_path_is_decided_as_git_decides_it(tricky_tree):
    paths = every_path(tricky_tree)
    expected = git_ignored(tricky_tree, sorted(paths))
    tree = IgnoreTree(lambda folder: (tricky_tree / folder / ".gitignore").read_bytes()
                      if (tricky_tree / folder / ".gitignore").is_file() else None)
    ours = {path for path, is_dir in paths.items() if tree.ignored(path, is_dir)}
    assert len(expected) > 40 and len(paths) - len(expected) > 30  # the tree has both, plenty of each
    assert sorted(ours - expected) == [] and sorted(expected - ours) == []
