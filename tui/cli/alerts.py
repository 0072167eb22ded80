"""`homegpu alerts test`: one notification to every [alerts] notify URL, saying which arrived."""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

from homegpu.tui.cli.common import UserError, load_spec


def register(commands: argparse._SubParsersAction) -> None:
    alerts = commands.add_parser(
        "alerts", help="try the [alerts] notify URLs",
        description="Work with [alerts]' notifications (docs/notifications.md).")
    actions = alerts.add_subparsers(dest="alerts_command", metavar="ACTION", required=True)
    test = actions.add_parser(
        "test", help="send one notification to every notify URL and say which arrived",
        description="Send a test notification (its title names the cluster) to every URL of [alerts] notify, all "
                    "at once, and print one line per URL: arrived, or why not. A URL is named by its place in the "
                    "list and its service, never by its text, which may hold a token. Exit 0 when all arrived.")
    test.set_defaults(handler=run_test)


def run_test(args: argparse.Namespace) -> int:
    from homegpu.remote.alerts import send_once  # not loaded for the other commands

    spec = load_spec(args)
    targets = spec.alerts.notify
    if not targets:
        raise UserError("[alerts] has no notify URLs to test; add some, e.g. notify = [\"ntfys://ntfy.sh/my-topic\"] "
                        "(docs/notifications.md)")
    title = f"homegpu {spec.name}: test"
    body = "A test notification from `homegpu alerts test`: alerts will arrive here."
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        problems = list(pool.map(lambda target: send_once(target.url, title, body, "info"), targets))
    for index, (target, problem) in enumerate(zip(targets, problems), 1):
        print(f"{target.shown(index)}: {'arrived' if problem is None else f'failed: {problem}'}")
    arrived = problems.count(None)
    print(f"{arrived} of {len(targets)} arrived")
    return 0 if arrived == len(targets) else 1
