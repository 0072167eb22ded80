"""gitignore's pattern language, read and matched as git itself does (its dir.c and wildmatch.c).

Code sync leaves out what a code dir's `.gitignore` (or `.homegpuignore`) files say; users write those
for git, so a pattern must mean here exactly what it means to git: `#` comments, `!` re-including,
a trailing `/` for directories only, a `/` at the start or in the middle anchoring to the file's
folder, `*`, `?`, `[...]` (with `!`/`^` and `[:classes:]`), `**/`, `/**`, `a/**/b`, `\\` escapes and
trailing spaces dropped unless escaped. A deeper file's patterns win over a shallower one's, the
last matching pattern of a file wins, and nothing under an ignored directory can be re-included.

Each pattern becomes a regular expression for what git's wildmatch matches, and each ignore file one
expression of them all, last pattern first, so a path costs one match per ignore file above it
however long the files are. Matching works on bytes, as git does: `?` is one byte of a UTF-8 name.

Pure: ignore files' text in, decisions out. Which files exist is the caller's (code_filter reads
them); tests/test_ignore_rules.py checks the decisions against `git check-ignore` on a real tree.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

BOM = b"\xef\xbb\xbf"
WILDCARDS = b"*?[\\"  # git's "glob special" characters: a pattern's literal head ends at the first
NEVER = b"(?!)"  # what a glob that can match nothing becomes (a trailing '\', an unclosed '[')
SLASH, STAR, QUESTION, OPEN, CLOSE, BACKSLASH, BANG, CARET, DASH, COLON, SPACE = b"/*?[]\\!^-: "
CLASSES: dict[bytes, Callable[[int], bool]] = {
    b"alnum": lambda c: chr(c).isascii() and chr(c).isalnum(),
    b"alpha": lambda c: chr(c).isascii() and chr(c).isalpha(),
    b"blank": lambda c: c in b" \t",
    b"cntrl": lambda c: c < 32 or c == 127,
    b"digit": lambda c: 48 <= c <= 57,
    b"graph": lambda c: 33 <= c <= 126,
    b"lower": lambda c: 97 <= c <= 122,
    b"print": lambda c: 32 <= c <= 126,
    b"punct": lambda c: 33 <= c <= 126 and not chr(c).isalnum(),
    b"space": lambda c: c in b" \t\n\r",  # git's own isspace: no \v, no \f
    b"upper": lambda c: 65 <= c <= 90,
    b"xdigit": lambda c: c in b"0123456789abcdefABCDEF",
}


@dataclass(frozen=True)
class Pattern:
    """One line of an ignore file. `glob` is what is matched: without its `!`, its leading `/` and its
    trailing `/`. `anchored` (it holds a `/`): matched against the path from the file's folder, else
    against the last name of the path alone, at any depth."""

    glob: bytes
    negated: bool = False
    dir_only: bool = False
    anchored: bool = False

    def regex(self) -> bytes:
        """The paths (from the ignore file's folder), or for a pattern that is not anchored the names,
        that this pattern matches, its negation aside.

        An anchored pattern's literal head is compared as it is and only the rest goes to wildmatch,
        as git's match_pathname does: so in `foo**/bar` the `**` starts a pattern and crosses folders.
        """
        if not self.anchored:
            return glob_regex(self.glob)  # of the name alone
        head = next((i for i, char in enumerate(self.glob) if char in WILDCARDS), len(self.glob))
        return re.escape(self.glob[:head]) + glob_regex(self.glob[head:])


def parse(text: bytes) -> tuple[Pattern, ...]:
    """The patterns of an ignore file, in order (git reads a UTF-8 byte order mark and CRLF line ends too)."""
    patterns = []
    for line in text.removeprefix(BOM).split(b"\n"):
        line = line.removesuffix(b"\r")
        if not line or line.startswith(b"#"):
            continue
        pattern = _pattern(_trim_trailing_spaces(line))
        if pattern.glob:  # "", "/" and "!" match nothing in git either
            patterns.append(pattern)
    return tuple(patterns)


def _pattern(line: bytes) -> Pattern:
    negated = line.startswith(b"!")
    line = line[1:] if negated else line
    dir_only = line.endswith(b"/")
    line = line[:-1] if dir_only else line
    anchored = b"/" in line
    return Pattern(line[1:] if line.startswith(b"/") else line, negated, dir_only, anchored)


def _trim_trailing_spaces(line: bytes) -> bytes:
    """The line less its trailing spaces (not tabs), but those escaped with a backslash."""
    end, i = len(line), 0
    last_space = None
    while i < end:
        if line[i] == SPACE:
            last_space = i if last_space is None else last_space
        elif line[i] == BACKSLASH:  # a backslash keeps the next character, whatever it is
            i += 1
            if i == end:
                return line
            last_space = None
        else:
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


def wildmatch(glob: bytes, text: bytes) -> bool:
    """Whether git's wildmatch (with WM_PATHNAME, as ignore files use it) matches `text` with `glob`."""
    return re.fullmatch(glob_regex(glob), text, re.DOTALL) is not None


def glob_regex(glob: bytes) -> bytes:
    """`glob` as a regular expression matching what git's wildmatch matches with WM_PATHNAME: `*`, `?`
    and `[...]` never match a '/'; `**` at the start or after a '/', and at the end or before one,
    crosses folders (`**/` matches none too); any other `**` is a `*`. Applied to a name alone (a
    pattern without '/'), it matches what git's match without WM_PATHNAME would, a name having no '/'."""
    out, i = [], 0
    while i < len(glob):
        char = glob[i]
        if char == STAR:
            end = i
            while end < len(glob) and glob[end] == STAR:
                end += 1
            after = glob[end:end + 2]
            crosses = end - i > 1 and (i == 0 or glob[i - 1] == SLASH) and (after[:1] in (b"", b"/") or after == b"\\/")
            if crosses and after[:1] == b"/":
                out.append(b"(?:.*/)?")
                end += 1
            else:
                out.append(b".*" if crosses else b"[^/]*")
            i = end
        elif char == QUESTION:
            out.append(b"[^/]")
            i += 1
        elif char == OPEN:
            i, members = _bracket(glob, i)
            if members is None:
                return NEVER
            out.append(_char_class(members))
        elif char == BACKSLASH:
            if i + 1 == len(glob):
                return NEVER
            out.append(re.escape(glob[i + 1:i + 2]))
            i += 2
        else:
            out.append(re.escape(glob[i:i + 1]))
            i += 1
    return b"".join(out)


def _bracket(glob: bytes, i: int) -> tuple[int, set[int] | None]:
    """The `[...]` starting at `i`: (the index after its ']', the bytes it matches), read as wildmatch
    reads it (the first member may be ']', `!` or `^` negates, a `-` between two members is a range);
    (_, None) where it never closes or names no class git knows."""
    i += 1
    char = _at(glob, i)
    negated = char in (BANG, CARET)
    if negated:
        i += 1
        char = _at(glob, i)
    previous, members = 0, set()
    while True:
        if char == 0:
            return i, None
        if char == BACKSLASH:  # the next character as it is
            i += 1
            char = _at(glob, i)
            if char == 0:
                return i, None
            members.add(char)
        elif char == DASH and previous and _at(glob, i + 1) not in (0, CLOSE):  # a range "a-z"
            i += 1
            char = _at(glob, i)
            if char == BACKSLASH:
                i += 1
                char = _at(glob, i)
                if char == 0:
                    return i, None
            members.update(range(previous, char + 1))
            char = 0  # no range starts from a range's end
        elif char == OPEN and _at(glob, i + 1) == COLON:  # "[:class:]"
            close = glob.find(b"]", i + 2)
            if close < 0:
                return i, None
            name = glob[i + 2:close]
            if not name.endswith(b":"):
                members.add(OPEN)  # no ":]": a plain '['
            elif (test := CLASSES.get(name[:-1])) is None:
                return i, None
            else:
                members.update(byte for byte in range(256) if test(byte))
                i, char = close, 0
        else:
            members.add(char)
        previous = char
        i += 1
        char = _at(glob, i)
        if char == CLOSE:
            break
    return i + 1, (set(range(256)) - members if negated else members) - {SLASH}


def _char_class(members: set[int]) -> bytes:
    """A regular expression's class of exactly these bytes (never a '/': the caller leaves it out)."""
    if not members:
        return NEVER
    ranges, ordered = [], sorted(members)
    start = previous = ordered[0]
    for byte in ordered[1:] + [-1]:
        if byte != previous + 1:
            ranges.append(b"\\x%02x" % start + (b"-\\x%02x" % previous if previous > start else b""))
            start = byte
        previous = byte
    return b"[" + b"".join(ranges) + b"]"


def _at(glob: bytes, i: int) -> int:
    """The byte at `i`, or 0 past the end (as C's string ends)."""
    return glob[i] if i < len(glob) else 0


class _IgnoreFile:
    """One ignore file's patterns as few expressions: those matched against a name, and those matched
    against the path, each for directories and for the rest, last pattern first (the first alternative
    that matches is the last pattern of its kind that does); the later of the two kinds wins, as git's
    last matching pattern does."""

    def __init__(self, patterns: tuple[Pattern, ...]) -> None:
        self.patterns = patterns
        self._expressions = {(anchored, is_dir): self._combined(anchored, is_dir)
                             for anchored in (False, True) for is_dir in (False, True)}

    def _combined(self, anchored: bool, is_dir: bool) -> re.Pattern[bytes] | None:
        kept = [(k, pattern) for k, pattern in enumerate(self.patterns)
                if pattern.anchored == anchored and (is_dir or not pattern.dir_only)]
        alternatives = [b"(?P<p%d>%s)" % (k, pattern.regex()) for k, pattern in reversed(kept)]
        return re.compile(b"|".join(alternatives), re.DOTALL) if alternatives else None

    def decide(self, path: bytes, is_dir: bool) -> bool | None:
        """True: ignored, False: re-included by a `!` pattern, None: no pattern here matches `path`."""
        last = -1
        for anchored, text in ((False, path.rpartition(b"/")[2]), (True, path)):
            regex = self._expressions[anchored, is_dir]
            found = regex.fullmatch(text) if regex is not None else None
            last = max(last, int(found.lastgroup[1:])) if found else last
        return None if last < 0 else not self.patterns[last].negated


class IgnoreTree:
    """git's decision for every path of a tree whose folders may each hold an ignore file.

    `read(folder)` gives the ignore file's text of `folder` ("" is the top, else "a/b"), or None
    where there is none; each is read once, and only for folders that are not ignored themselves,
    as git reads them. Paths are relative to the top, with '/' between names.
    """

    def __init__(self, read: Callable[[str], bytes | None]) -> None:
        self._read = read
        self._files: dict[str, _IgnoreFile] = {}
        self._dirs: dict[str, bool] = {}

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether git ignores `rel`: under an ignored folder, or the last pattern that matches it in
        the deepest ignore file that has one is not a `!` one."""
        if is_dir:
            if rel not in self._dirs:
                self._dirs[rel] = self._ignored(rel, True)
            return self._dirs[rel]
        return self._ignored(rel, False)

    def _ignored(self, rel: str, is_dir: bool) -> bool:
        parent = rel.rpartition("/")[0]
        if parent and self.ignored(parent, True):
            return True
        path, folder = os.fsencode(rel), parent
        while True:
            local = path[len(os.fsencode(folder)) + 1:] if folder else path
            decision = self._file(folder).decide(local, is_dir)
            if decision is not None:
                return decision
            if not folder:
                return False
            folder = folder.rpartition("/")[0]

    def _file(self, folder: str) -> _IgnoreFile:
        if folder not in self._files:
            text = self._read(folder)
            self._files[folder] = _IgnoreFile(parse(text) if text else ())
        return self._files[folder]
