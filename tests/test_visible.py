"""Text from a node is shown, never sent: the pure function, the commands' output filter, the TUI's
entrances. tests/test_hostile_names.py drives the same through every command and the TUI on the LAN."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import namedtuple

import pytest
from textual.app import App
from textual.widgets import Static

from homegpu.remote.config.cluster_spec import embedded_default
from homegpu.remote.events import (
    NA, BandwidthMatrix, JobState, JobStateChanged, LinkResult, NodeState, NodeStateChanged, NodeStatsUpdated,
    PreflightResult,
)
from homegpu.remote.nodes import parse_agent_line, visible, visible_fields
from homegpu.tui.app.main import HomegpuApp
from homegpu.tui.app.screens import ConfirmScreen, TextScreen
from homegpu.tui.cli.terminal import VisibleStream, unfiltered, visible_output
from homegpu.tui.view.render import job_summary, node_cells, node_detail
from homegpu.tui.view.state import ClusterView

TITLE = "\x1b]0;pwned\x07"
CLIPBOARD = "\x1b]52;c;cHduZWQ=\x07"
CONTROLS = [chr(code) for code in (*range(0x20), *range(0x7f, 0xa0))]


@pytest.mark.parametrize("text, shown", [
    (TITLE, "\\x1b]0;pwned\\x07"),                      # OSC 0: the terminal's title
    (CLIPBOARD, "\\x1b]52;c;cHduZWQ=\\x07"),            # OSC 52: the clipboard
    ("\x1b[2Jgone", "\\x1b[2Jgone"),                    # CSI 2J: clear the screen
    ("\x9b31mred", "\\x9b31mred"),                      # CSI as the C1 control
    ("\x90q\x9c", "\\x90q\\x9c"),                       # DCS ... ST, C1 too
    ("lone \x1b", "lone \\x1b"),
    ("bell\x07 del\x7f nul\x00", "bell\\x07 del\\x7f nul\\x00"),
    ("a\tb\nc\r\nd\re", "a\\tb\\nc\\r\\nd\\re"),        # one line: tab, newline and return shown too
    ("[bold red]x[/]", "[bold red]x[/]"),               # markup is text here; the TUI never parses it
    ("NVIDIA H100 80GB HBM3 · 42 °C", "NVIDIA H100 80GB HBM3 · 42 °C"),
])
def test_visible_shows_each_control_character_as_its_escape(text: str, shown: str) -> None:
    assert visible(text) == shown


def test_visible_returns_plain_text_itself_and_na_stays_na() -> None:
    plain = "python3"
    assert visible(plain) is plain
    assert visible(NA) is NA and visible(NA, multiline=True) is NA


def test_multiline_keeps_newlines_and_tabs_only() -> None:
    assert visible("line 1\r\n\tline 2\n\x1b[2J\rline 3", multiline=True) == "line 1\n\tline 2\n\\x1b[2J\\rline 3"


def test_no_control_character_survives_either_form() -> None:
    text = "".join(CONTROLS)
    assert not set(visible(text)) & set(CONTROLS)
    assert not set(visible(text, multiline=True)) & set(CONTROLS) - {"\n", "\t"}


def hostile_stats():
    return parse_agent_line(json.dumps({
        "v": 1, "t": 1.0, "source": "nvidia-smi", "driver": None, "cuda": "12.4", "cpu": 5.0, "load": None,
        "mem_used": 1024, "mem_total": 2048, "disk_free": None,
        "gpus": [{"index": 0, "name": f"{TITLE}H100", "uuid": "GPU-1", "util": None, "mem_used": 10,
                  "mem_total": 100, "temp": 40, "power": None, "power_limit": 300, "sm_clock": None,
                  "processes": [{"pid": 7, "name": f"{CLIPBOARD}python3", "mem": None,
                                 "owner": {"kind": "process", "user": "\x9bevil", "uid": 1000}}]}]}))


def test_visible_fields_cleans_every_string_of_a_snapshot_and_keeps_the_rest() -> None:
    stats = hostile_stats()
    shown = visible_fields(stats)
    gpu, process = shown.gpus[0], shown.gpus[0].processes[0]
    assert gpu.name == "\\x1b]0;pwned\\x07H100" and process.name == "\\x1b]52;c;cHduZWQ=\\x07python3"
    assert process.owner.user == "\\x9bevil" and process.owner.uid == 1000
    assert shown.driver is NA and gpu.util is NA and process.mem is NA and process.owner.run_id is NA
    assert shown.load == (NA, NA, NA) and gpu.mem_percent == 10.0 and shown.cuda == "12.4"
    assert stats.gpus[0].name == f"{TITLE}H100"  # the data itself is untouched


def test_visible_fields_returns_what_has_nothing_to_clean_as_it_is() -> None:
    event = NodeStateChanged("node1", NodeState.ONLINE, "fine")
    assert visible_fields(event) is event
    pair = namedtuple("pair", "a b")
    assert visible_fields(pair("\x1b", 1)) == pair("\\x1b", 1)
    assert visible_fields({"\x07": ["\x1b", 2]}) == {"\\x07": ["\\x1b", 2]}
    assert visible_fields(LinkResult("a", "b", None, "\x1b[2Jrefused")).error == "\\x1b[2Jrefused"


# -- the commands: one filter on stdout and stderr ---------------------------------------------------


def test_the_commands_output_shows_controls_and_keeps_lines(capsys) -> None:
    saved = sys.stdout, sys.stderr
    with visible_output():
        print(f"gpu {TITLE}\tok\nnext", flush=True)
        print("\x9bwhy", file=sys.stderr)
        unfiltered(sys.stdout).write("\x1b[H")  # the escape homegpu sends itself (status --watch)
    assert (sys.stdout, sys.stderr) == saved
    out, err = capsys.readouterr()
    assert out == "gpu \\x1b]0;pwned\\x07\tok\nnext\n\x1b[H" and err == "\\x9bwhy\n"


def test_the_filter_is_the_stream_for_everything_else(capsys) -> None:
    stream = VisibleStream(sys.stdout)
    assert stream.isatty() == sys.stdout.isatty() and stream.encoding == sys.stdout.encoding
    assert unfiltered(stream) is sys.stdout and unfiltered(sys.stdout) is sys.stdout
    stream.writelines(["a\x1b", "b\n"])
    assert capsys.readouterr().out == "a\\x1bb\n"


# -- the TUI: its view takes events in visibly; toasts and dialogs are plain text ------------------------


def test_the_view_takes_node_text_in_visibly() -> None:
    view = ClusterView(embedded_default())
    name = next(iter(view.nodes))
    view.apply(NodeStatsUpdated(name, hostile_stats()))
    view.apply(NodeStateChanged(name, NodeState.ONLINE, f"reason {TITLE}"))
    view.bandwidth.finish(BandwidthMatrix((LinkResult(name, "b", None, f"{CLIPBOARD}refused"),)), f"{TITLE}x")
    detail = node_detail(view.nodes[name], 100).plain
    cells = " ".join(cell.plain for cell in node_cells(view.nodes[name])[0])
    for text in (detail, cells, view.bandwidth.error, view.bandwidth.matrix.results[0].error):
        assert "\x1b" not in text and "\x9b" not in text and "\\x1b]" in text, text
    assert "\\x1b]52;c;cHduZWQ=\\x07python3" in detail and "user \\x9bevil" in detail


def test_a_run_s_preflight_and_failure_that_quote_a_node_are_taken_in_visibly() -> None:
    view = ClusterView(embedded_default())
    view.apply(JobStateChanged("demo", "demo-1", JobState.FAILED, 1, 0, detail=f"failed: {CLIPBOARD}"))
    view.apply(PreflightResult("demo", "local", (f"python failed: {TITLE}",), warnings=("\x9b2J",)))
    summary = job_summary(view.job).plain
    assert "failed: \\x1b]52;c;cHduZWQ=\\x07" in summary and "python failed: \\x1b]0;pwned\\x07" in summary
    assert "⚠ \\x9b2J" in summary and "\x1b" not in summary


def test_toasts_are_plain_text_with_controls_shown(monkeypatch) -> None:
    said = []
    monkeypatch.setattr(App, "notify", lambda self, message, **options: said.append((message, options)))
    app = HomegpuApp(embedded_default())
    app.notify(f"[bold red]x[/] {TITLE}\nnext", severity="error")
    app.action_help_quit()  # Textual's own hint, which it writes in markup: said plainly
    assert said == [("[bold red]x[/] \\x1b]0;pwned\\x07\nnext", {"markup": False, "severity": "error"}),
                    ("Press q to quit", {"markup": False, "title": "Do you want to quit?"})]


def test_dialogs_show_a_str_as_it_is() -> None:
    async def bodies() -> list[str]:
        app = HomegpuApp(embedded_default())
        async with app.run_test(size=(100, 30)) as pilot:
            await app.push_screen(TextScreen("doctor", f"[bold red]x[/]{TITLE}\nnext"))
            await pilot.pause()
            shown = [str(widget.render()) for widget in app.screen.query(Static)]
            app.pop_screen()
            await app.push_screen(ConfirmScreen(f"Stop run [b]{CLIPBOARD}[/b]?"))
            await pilot.pause()
            return shown + [str(widget.render()) for widget in app.screen.query(Static)]

    shown = asyncio.run(bodies())
    assert "[bold red]x[/]\\x1b]0;pwned\\x07\nnext" in shown
    assert "Stop run [b]\\x1b]52;c;cHduZWQ=\\x07[/b]?" in shown


def test_a_redraw_timer_that_fires_as_the_app_shuts_down_draws_nothing() -> None:
    """Textual removes the screens' widgets before it stops the app's timers; a redraw in between found no panel
    (`NoMatches: No nodes match '#job'`, once in the suite as the dialogs test above closed its app)."""
    drawn = []

    async def ticks() -> None:
        app = HomegpuApp(embedded_default())
        async with app.run_test(size=(100, 30)):
            tick = app._while_running(lambda: drawn.append(app.query_one("#job")))
            tick()
        tick()  # shut down: the panels are gone

    asyncio.run(ticks())
    assert len(drawn) == 1
