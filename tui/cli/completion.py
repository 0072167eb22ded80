"""`homegpu --print-completion bash|zsh|fish`: the tab-completion script, written by shtab from the parser.

The script is static, so a Tab press starts no Python for commands, options and choices. Names that live in
the cluster file or in serve's queue cannot be written into it: an argument known by its metavar (JOB, NODE,
ID) completes by running `homegpu --complete KIND` (completion_names.py) with the --config or --local typed
on the line, so it offers the file's names as they are now. FILE, DOCKERFILE and DIR complete paths.

main.py imports this module only for --print-completion: shtab never slows another command.
"""

from __future__ import annotations

import argparse
from typing import Iterator

import shtab

from homegpu.tui.cli.completion_names import COMPLETE_OPTION, JOBS, NODES, QUEUE_IDS

NAMES_BY_METAVAR = {"JOB": JOBS, "NODE": NODES, "ID": QUEUE_IDS}
KINDS = tuple(NAMES_BY_METAVAR.values())
PATHS_BY_METAVAR = {"FILE": shtab.FILE, "DOCKERFILE": shtab.FILE, "DIR": shtab.DIRECTORY}

# Each shell's function that runs `homegpu --complete KIND`, handing on the line's --config FILE (also
# --config=FILE) or --local. Bash and fish call theirs with the word being completed; zsh's adds the names.
BASH_NAMES = f"""\
_homegpu_names() {{  # $1=KIND $2=the word being completed
  local i where=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${{COMP_WORDS[i]}} in
      --local) where=(--local) ;;
      --config) [[ ${{COMP_WORDS[i+1]}} == = ]] && ((i++)); where=(--config "${{COMP_WORDS[i+1]}}") ;;
    esac
  done
  compgen -W "$(homegpu {COMPLETE_OPTION} "$1" "${{where[@]}}" 2>/dev/null)" -- "$2"
}}
"""
ZSH_NAMES = f"""\
_homegpu_names() {{  # $1=KIND
  local i
  local -a line where names
  line=(${{(z)LBUFFER}})
  for ((i = 1; i <= ${{#line}}; i++)); do
    case ${{line[i]}} in
      --local) where=(--local) ;;
      --config) where=(--config "${{(Q)line[i+1]}}") ;;
      --config=*) where=(--config "${{(Q)line[i]#--config=}}") ;;
    esac
  done
  names=(${{(f)"$(homegpu {COMPLETE_OPTION} $1 $where 2>/dev/null)"}})
  compadd -a names
}}
"""
FISH_NAMES = f"""\
function __homegpu_names --argument-names kind
    set -l where
    set -l words (commandline -opc)
    for i in (seq (count $words))
        switch $words[$i]
            case --local
                set where --local
            case --config
                if test $i -lt (count $words)
                    set where --config $words[(math $i + 1)]
                end
            case '--config=*'
                set where --config (string replace -- --config= '' $words[$i])
        end
    end
    homegpu {COMPLETE_OPTION} $kind $where 2>/dev/null
end
"""


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `parser` (homegpu's) for `shell`: bash, zsh or fish. It changes `parser`,
    which --print-completion then exits without using."""
    for action in all_actions(parser):
        if action.metavar in NAMES_BY_METAVAR:
            action.complete = names_completion(NAMES_BY_METAVAR[action.metavar])
        elif action.metavar in PATHS_BY_METAVAR:
            action.complete = PATHS_BY_METAVAR[action.metavar]
        if isinstance(action, argparse._SubParsersAction):
            describe_by_help_line(action)
    return shtab.complete(parser, shell, preamble=names_functions(shell))


def names_completion(kind: str) -> dict[str, str]:
    """shtab's `complete` for an argument whose values `homegpu --complete KIND` lists."""
    return {"bash": names_function(kind), "zsh": names_function(kind), "fish": f"(__homegpu_names {kind})"}


def names_functions(shell: str) -> str:
    """The shell functions the script's arguments call for names: one per KIND for bash and zsh, all
    calling the shared one; fish calls its shared one directly."""
    if shell == "bash":
        return BASH_NAMES + "".join(f'{names_function(kind)}() {{ _homegpu_names {kind} "$1"; }}\n'
                                    for kind in KINDS)
    if shell == "zsh":
        return ZSH_NAMES + "".join(f"{names_function(kind)}() {{ _homegpu_names {kind} }}\n" for kind in KINDS)
    return FISH_NAMES


def names_function(kind: str) -> str:
    """The bash and zsh function that completes KIND's names: _homegpu_complete_queue_ids for queue-ids."""
    return f"_homegpu_complete_{kind.replace('-', '_')}"


def describe_by_help_line(commands: argparse._SubParsersAction) -> None:
    """Give each command its one-line help as its description: zsh and fish list a command with its
    description (a paragraph, cut off mid-sentence) where --help lists the one line."""
    for listed in commands._choices_actions:
        commands.choices[listed.dest].description = listed.help


def all_actions(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """Every argument of `parser` and of its commands, however deep (image build, image copy)."""
    for action in parser._actions:
        yield action
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield from all_actions(command)
