"""Modal dialogs: confirm (kill), choose one of a list (send event, filters), and help."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from runner.tui import literal


class ConfirmScreen(ModalScreen[bool]):
    """Ask a yes/no question; dismisses with ``True`` on ``y``/Yes."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str, *, yes: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.yes = yes

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Label(literal.text(self.question), id="question")
            with Horizontal(id="buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        """Dismiss with ``value``."""
        self.dismiss(value)


class ChoiceScreen(ModalScreen[str | None]):
    """Pick one string from ``choices``; dismisses with it, or ``None`` on escape."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, choices: list[str], *, empty: str = "nothing to choose") -> None:
        super().__init__()
        self.title_text = title
        self.choices = choices
        self.empty = empty

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Label(literal.text(self.title_text), id="question")
            if self.choices:
                options = [Option(literal.text(c, limit=200), id=c) for c in self.choices]
                yield OptionList(*options, id="choices")
            else:
                yield Label(literal.text(self.empty), classes="muted")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        """Dismiss without a choice."""
        self.dismiss(None)


#: (group, [(keys, what)]) shown by ``?``.
KEYS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "Views",
        [
            ("1", "instances"),
            ("2", "workers"),
            ("3", "sensors, events and commands"),
            ("4", "flows and versions (m: migrate a flow's instances to the loaded version)"),
            ("ctrl+p", "command palette (every action below)"),
            ("?", "this help"),
            ("q", "quit"),
        ],
    ),
    (
        "Instances",
        [
            ("↑ ↓ pgup pgdn", "move"),
            ("g / G  home end", "first / last row"),
            ("space", "mark / unmark (commands act on the marked set)"),
            ("enter", "detail of the instance"),
            ("e", "explain: its timeline (waits and their causes) and what happens next"),
            ("l", "log: the latest attempt's output, followed live"),
            ("/", "filter by text (id, flow, state, status, error, data)"),
            ("f", "filter by status"),
            ("F", "filter by flow"),
            ("o / O", "next sort column / reverse order (or click a header)"),
            ("escape", "clear filters, then marks"),
        ],
    ),
    (
        "Commands (selected or marked)",
        [
            ("p", "pause, or resume when paused"),
            ("k", "kill (asks first)"),
            ("r", "retry a failed instance"),
            ("z / w", "sleep for a while (nothing spent) / wake a sleeping instance now"),
            ("s", "send an event its state accepts"),
        ],
    ),
    (
        "Detail",
        [
            ("p k r s", "as above, on this instance"),
            ("l", "log of the attempt under the attempts table's cursor (else the latest)"),
            ("escape", "back"),
        ],
    ),
    (
        "Log",
        [
            ("[ / ]", "previous / next attempt"),
            ("/ n", "search / next match"),
            ("g / G", "top / bottom (G follows new output again)"),
            ("w", "wrap long lines"),
            ("s", "streams shown: both, stdout, stderr"),
            ("escape", "back"),
        ],
    ),
]


class HelpScreen(ModalScreen[None]):
    """Every key of the console, grouped."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def compose(self) -> ComposeResult:
        text = Text()
        for group, keys in KEYS:
            text.append(f"{group}\n", style="bold underline")
            for key, what in keys:
                text.append(f"  {key:<18}", style="bold cyan")
                text.append(f"{what}\n")
            text.append("\n")
        with VerticalScroll(id="dialog", classes="dialog help"):
            yield Label("Keys", id="question")
            yield Static(text, id="help-text")

    def action_close(self) -> None:
        """Close the help."""
        self.dismiss(None)


class StoppingScreen(ModalScreen[None]):
    """Shown while the embedded worker stops: "stopping: N attempts running, up to G s
    (q again to abort)", refreshed every 0.25 s; the app exits once the worker stopped.

    ``stopper`` is duck-typed (the console never imports the worker): ``running()`` (int),
    ``grace`` (seconds), ``stop()`` (first call graceful, second abort), ``stopped()``.
    """

    BINDINGS = [Binding("q,ctrl+c", "abort", "Abort")]

    def __init__(self, stopper: object, clock: object) -> None:
        super().__init__()
        self.stopper = stopper
        self.clock = clock
        self.deadline = clock() + stopper.grace  # type: ignore[attr-defined,operator]
        self.aborting = False

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Label(self.text(), id="question")

    def text(self) -> str:
        """The line shown now."""
        n = self.stopper.running()  # type: ignore[attr-defined]
        if self.aborting:
            return f"aborting: {n} attempts left for recovery as lost"
        left = max(0.0, self.deadline - self.clock())  # type: ignore[operator]
        return f"stopping: {n} attempts running, up to {left:.0f} s (q again to abort)"

    def on_mount(self) -> None:
        self.set_interval(0.25, self.tick)

    def tick(self) -> None:
        """Refresh the line; exit the app once the worker has stopped."""
        if self.stopper.stopped():  # type: ignore[attr-defined]
            self.app.exit()
            return
        self.query_one("#question", Label).update(self.text())

    def action_abort(self) -> None:
        """Second ``q``: abort now (running attempts are left to be recovered as lost)."""
        if not self.aborting:
            self.aborting = True
            self.stopper.stop()  # type: ignore[attr-defined]
            self.tick()
