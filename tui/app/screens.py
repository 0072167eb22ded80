"""The TUI's dialogs: launch (or queue) a job, confirm, quit with a job running, and read-only text (help, doctor).

Each dismisses with its answer; the app decides what to do with it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static

from homegpu.remote.config import JobSpec
from homegpu.remote.nodes import visible
from homegpu.remote.plan import JobLayout
from homegpu.tui.view.text import runs_what


def launch_preview(job: JobSpec, layout: JobLayout) -> Text:
    """What launching `job` starts: its settings, each worker with the TF_CONFIG it will get, then
    the device plan (or why there is none yet)."""
    slots, plan_lines = layout.slots, layout.plan_lines()
    if job.uses_trainer and job.is_pytorch:  # the PyTorch demo takes the trainer's epochs and batch, and its own model
        what = (f"the PyTorch demo: {'a CNN' if job.model == 'cnn' else 'an MLP'} on synthetic data, {job.epochs} "
                f"epochs, batch {job.batch_size} per process")
    elif job.uses_trainer and job.is_jax:
        what = f"the JAX demo: an MLP on synthetic data, {job.epochs} epochs, batch {job.batch_size} per process"
    elif job.uses_trainer:
        what = f"trainer: {job.model} on {job.data} data, {job.epochs} epochs, batch {job.batch_size}"
    else:  # epochs and batch_size are the trainer's: a script's own schedule is in its args
        what = f"script: {runs_what(job)} {shlex.join(job.args)}".rstrip()
    out = Text.assemble((job.name, "bold"), f"  {what}, image {job.image}, "
                        f"restart {job.restart} (max {job.max_restarts})\n")
    for slot in slots:
        role = "chief" if slot.is_chief else "worker"
        out.append(f"\n{slot.label}", style="bold")
        out.append(f" ({role}, index {slot.index}) on {slot.node.name} [{slot.node.runtime}]\n")
        out.append(f"  {layout.launch_line(job, slot, quote=False)}\n", style="cyan")
    if plan_lines:
        out.append("\nDevice plan\n", style="bold")
        out.append("".join(f"  {visible(line)}\n" for line in plan_lines))  # they name the nodes' GPUs
    return out


def as_text(body: str | Text) -> Text:
    """A dialog's body: a str is plain text (it may quote a node: no markup, controls shown), a Text is
    drawn as built."""
    return Text(visible(body, multiline=True)) if isinstance(body, str) else body


@dataclass(frozen=True)
class LaunchChoice:
    """What the launch dialog was answered with: launch `job` now, or (`queue`) submit it to serve's queue."""

    job: str
    queue: bool = False


class LaunchScreen(ModalScreen[LaunchChoice | None]):
    """Choose a job, see the nodes and the TF_CONFIG it will generate, then launch it now (Enter) or queue it
    for `homegpu serve` to start when its nodes are free (u). With `running` (the job this app runs) it can
    only queue: Enter queues too."""

    BINDINGS = [Binding("escape", "dismiss_none", "Cancel"), Binding("u", "queue", "Queue")]

    def __init__(self, jobs: Sequence[JobSpec], layout_of: Callable[[JobSpec], JobLayout], running: str = "") -> None:
        super().__init__()
        self.jobs, self.layout_of, self.running = list(jobs), layout_of, running

    def compose(self) -> ComposeResult:
        title = (f"{self.running} runs here: queue a job for serve (Enter or u)" if self.running
                 else "Launch a job now (Enter), or queue it for serve (u)")
        with Vertical(id="dialog", classes="wide"):
            yield Label(title, classes="title")
            yield OptionList(*(job.name for job in self.jobs), id="jobs")
            with VerticalScroll(id="preview-box"):
                yield Static(id="preview")
            with Horizontal(classes="buttons"):
                yield Button("Launch", variant="primary", id="launch", disabled=bool(self.running))
                yield Button("Queue", id="queue-job")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        jobs = self.query_one("#jobs", OptionList)
        jobs.highlighted = 0
        jobs.focus()
        self._preview(0)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self._preview(event.option_index)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(LaunchChoice(self.jobs[event.option_index].name, queue=bool(self.running)))

    def _preview(self, index: int) -> None:
        job = self.jobs[index]
        self.query_one("#preview", Static).update(launch_preview(job, self.layout_of(job)))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id in ("launch", "queue-job"):
            self.dismiss(LaunchChoice(self._chosen(), queue=event.button.id == "queue-job"))
        else:
            self.dismiss(None)

    def _chosen(self) -> str:
        return self.jobs[self.query_one("#jobs", OptionList).highlighted or 0].name

    def action_queue(self) -> None:
        self.dismiss(LaunchChoice(self._chosen(), queue=True))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A question with yes and no: y says yes; n and Escape say no; Enter presses the focused button, which
    starts on no, so a stray Enter changes nothing."""

    BINDINGS = [Binding("escape", "answer(False)", "No"), Binding("y", "answer(True)", "Yes"),
                Binding("n", "answer(False)", "No")]

    def __init__(self, question: str | Text, yes: str = "Yes", no: str = "No") -> None:
        super().__init__()
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(as_text(self.question), id="question")
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="error", id="yes")
                yield Button(self.no, id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class QuitScreen(ModalScreen[str | None]):
    """Quitting with a job running: leave it running on its nodes, stop it, or stay."""

    BINDINGS = [Binding("escape", "choose('')", "Stay"), Binding("l", "choose('leave')", "Leave running"),
                Binding("s", "choose('stop')", "Stop job")]

    def __init__(self, job: str) -> None:
        super().__init__()
        self.job = job

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(f"{self.job} is running. Leave it running on its nodes (a later `homegpu` "
                         f"attaches to it), or stop every worker before quitting?", id="question")
            with Horizontal(classes="buttons"):
                yield Button("Leave running", variant="primary", id="leave")
                yield Button("Stop job", variant="error", id="stop")
                yield Button("Stay", id="stay")

    def on_mount(self) -> None:
        self.query_one("#leave", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_choose("" if event.button.id == "stay" else event.button.id)

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice or None)


class TextScreen(ModalScreen[None]):
    """Read-only text (help, a doctor report); any of Escape, q or Enter closes it."""

    BINDINGS = [Binding("escape,q,enter,question_mark", "close", "Close")]

    def __init__(self, title: str, body: str | Text) -> None:
        super().__init__()
        self.heading, self.body = title, body

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="wide"):
            yield Label(self.heading, classes="title")
            with VerticalScroll(id="body"):
                yield Static(as_text(self.body))
            yield Label("↑/↓ PgUp/PgDn scroll · Escape closes", classes="hint")

    def on_mount(self) -> None:
        self.query_one("#body", VerticalScroll).focus()  # so the arrow keys scroll a long text

    def action_close(self) -> None:
        self.dismiss(None)
