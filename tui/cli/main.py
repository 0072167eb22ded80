"""The `homegpu` command line: parses arguments and hands each subcommand to its module.

User mistakes surface as one `homegpu: error: ...` line and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from homegpu.remote.config import ConfigError
from homegpu.tui.cli.common import EXIT_USAGE, EXPERIMENTS, UserError, load_spec
from homegpu.tui.cli.completion_names import COMPLETE_OPTION, print_names

DESCRIPTION = """\
Train TensorFlow across the GPU machines in your home or lab from one terminal.

With no COMMAND, homegpu opens its terminal UI: every node's GPUs, CPU and memory live, the
bandwidth between them, and a job's progress and logs; `l` launches a job, `s` stops it, `?` shows
every key.

homegpu reads cluster.toml (the nodes, how to reach them over SSH, and the jobs). With no
--config and no ./cluster.toml it uses the embedded default: this machine as the only node."""

EPILOG = """\
examples:
  homegpu                           open the terminal UI on ./cluster.toml (or this machine)
  homegpu --local run --no-tui      train the demo on this machine (two workers)
  homegpu init --node desktop=192.168.1.20 --node laptop=laptop.local --user alice
  homegpu check
  homegpu --config ~/lab/cluster.toml check"""

# The order `homegpu --help` lists the commands in: what a newcomer needs first, then day-to-day use,
# then the always-on serve and its queue, then the rarer ones. A command missing here is listed last.
HELP_ORDER = (
    "init", "check", "doctor", "run", "status", "logs", "stop", "jobs", "report", "tfconfig", "trust",
    "bandwidth", "image", "serve", "submit", "queue", "cancel", "history", "alerts", "wake", "sleep",
)
SHELLS = ("bash", "zsh", "fish")


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # not loaded for a Tab press (main)

    try:
        return version("homegpu")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    # Imported here, not above: a Tab press runs `homegpu --complete` (main), which needs none of them.
    from homegpu.tui.cli import (
        alerts, bandwidth, config, doctor, history, image, jobs, queue, report, serve, sleep_wake, status, trust,
    )

    parser = argparse.ArgumentParser(
        prog="homegpu", description=DESCRIPTION, epilog=EPILOG, formatter_class=MainFormatter,
    )
    parser.add_argument("--version", action="version", version=f"homegpu {package_version()}")
    parser.add_argument("--print-completion", choices=SHELLS, metavar="SHELL", action=PrintCompletion,
                        help="print the tab-completion script for bash, zsh or fish (docs/completion.md)")
    add_cluster_options(parser, default=None)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    config.register(commands)
    status.register(commands)
    trust.register(commands)
    sleep_wake.register(commands)
    doctor.register(commands)
    bandwidth.register(commands)
    jobs.register(commands)
    image.register(commands)
    report.register(commands)
    serve.register(commands)
    history.register(commands)
    queue.register(commands)
    alerts.register(commands)
    list_in_help_order(commands)
    return parser


def list_in_help_order(commands: argparse._SubParsersAction) -> None:
    """Reorder the commands as HELP_ORDER says: in --help, in a mistyped command's error and in completion.
    The modules register them by family (config.py adds both check and init), not in that order."""
    def rank(name: str) -> int:
        return HELP_ORDER.index(name) if name in HELP_ORDER else len(HELP_ORDER)

    commands._choices_actions.sort(key=lambda action: rank(action.dest))
    for name in sorted(commands.choices, key=rank):
        commands.choices[name] = commands.choices.pop(name)


class PrintCompletion(argparse.Action):
    """--print-completion SHELL: prints the script and exits, as --version does. shtab loads only here,
    so every other command starts no slower for it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from homegpu.tui.cli.completion import completion_script

        print(completion_script(parser, values))
        parser.exit()


def add_cluster_options(parser: argparse.ArgumentParser, default: object) -> None:
    """--config and --local. Every command takes them too (`homegpu check --config FILE`), with
    SUPPRESS as the default there, so a value given before the command is not reset after it."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--config", metavar="FILE", default=default,
                       help="cluster file to use (default: ./cluster.toml, else the embedded default)")
    where.add_argument("--local", action="store_true", default=False if default is None else default,
                       help="use the embedded default (this machine as the only node, a two-worker demo "
                            "job) even where a cluster.toml exists")


class ParagraphFormatter(argparse.HelpFormatter):
    """Wraps descriptions to the terminal paragraph by paragraph; indented lines (examples) stay as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith(" ") for line in lines[1:]) or paragraph.startswith(" "):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(super()._fill_text(paragraph, width, indent))
        return "\n\n".join(out)


class MainFormatter(ParagraphFormatter):
    """`homegpu --help`'s: the one-line help of each command starts where --config FILE's does, so at 80
    columns each fits its line; a longer option (--print-completion SHELL) puts its help below instead."""

    def __init__(self, prog: str, **kwargs) -> None:
        super().__init__(prog, **{**kwargs, "max_help_position": 17})


class CommandParser(argparse.ArgumentParser):
    """A command's parser: wraps its help like the main one and takes --config and --local too."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "formatter_class": ParagraphFormatter})
        add_cluster_options(self, default=argparse.SUPPRESS)


def open_tui(args: argparse.Namespace) -> int:
    from homegpu.tui.app.main import run_app  # Textual loads only when the UI opens

    return run_app(load_spec(args), EXPERIMENTS)


def main(argv: Sequence[str] | None = None) -> int:
    """The `homegpu` command. What it prints passes a filter: text from a node is shown, its control
    sequences are never sent to the terminal (tui/cli/terminal.py). `homegpu --complete KIND` (what
    the completion scripts run on Tab) answers before any command module loads."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == [COMPLETE_OPTION]:
        return print_names(argv[1:])
    from homegpu.tui.cli.terminal import visible_output  # it loads remote/nodes: not for a Tab press

    with visible_output():
        return _command(argv)


def _command(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        # textual-serve runs the UI through pipes, having chosen Textual's web driver: that is its terminal
        if not (sys.stdin.isatty() and sys.stdout.isatty()) and not os.environ.get("TEXTUAL_DRIVER"):
            parser.print_help()  # no terminal to draw on: say what there is instead
            return 0
        handler = open_tui
    try:
        return handler(args)
    except (ConfigError, UserError) as exc:
        print(f"homegpu: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("homegpu: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `homegpu status | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
