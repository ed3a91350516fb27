"""The console's explain screen (``e`` on an instance): the same text as ``flowrun explain``
(``runner.ops.explanation.render_text``), refreshed every few seconds."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from runner.tui import literal
from runner.tui.guard import FailureLine, GuardedScreen, background, deliver

#: Longest line of an explanation shown, in characters.
EXPLAIN_LIMIT = 2000


class ExplainScreen(GuardedScreen):
    """Why instance ``instance_id`` is where it is, and what happens next."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, instance_id: int) -> None:
        super().__init__()
        self.instance_id = instance_id
        self.text = ""

    def compose(self) -> ComposeResult:
        yield FailureLine()
        with VerticalScroll(id="explain"):
            yield Static(Text(f"explaining instance {self.instance_id}…"), id="explain-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#explain").border_title = f"explain {self.instance_id}"
        self.refresh_data()
        if self.app.refresh_interval > 0:
            self.set_interval(max(2.0, self.app.refresh_interval), self.refresh_data)

    def refresh_data(self) -> None:
        """Re-read and re-explain the instance in a thread worker."""
        self._load()

    @background("explain", exclusive=True)
    def _load(self) -> None:
        text = self.app.data.explain(self.instance_id)
        deliver(self.app, self._show, text)

    def _show(self, text: str | None) -> None:
        self.text = text if text is not None else f"no instance {self.instance_id}"
        shown = literal.text(self.text, limit=EXPLAIN_LIMIT, multiline=True)
        self.query_one("#explain-text", Static).update(shown)
