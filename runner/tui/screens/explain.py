"""The console's explain screen (``e`` on an instance): the same text as ``flowrun explain``
(``runner.ops.explanation.render_text``), refreshed every few seconds."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static


class ExplainScreen(Screen):
    """Why instance ``instance_id`` is where it is, and what happens next."""

    BINDINGS = [Binding("escape", "app.pop_screen", "Back")]

    def __init__(self, instance_id: int) -> None:
        super().__init__()
        self.instance_id = instance_id
        self.text = ""

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="explain"):
            yield Static(f"explaining instance {self.instance_id}…", id="explain-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#explain").border_title = f"explain {self.instance_id}"
        self.refresh_data()
        if self.app.refresh_interval > 0:
            self.set_interval(max(2.0, self.app.refresh_interval), self.refresh_data)

    def refresh_data(self) -> None:
        """Re-read and re-explain the instance in a thread worker."""
        self._load()

    @work(thread=True, exclusive=True, group="explain")
    def _load(self) -> None:
        try:
            text = self.app.data.explain(self.instance_id)
        except Exception as exc:  # never crash the console on a read
            text = f"explain {self.instance_id}: {exc}"
        self.app.call_from_thread(self._show, text)

    def _show(self, text: str | None) -> None:
        self.text = text if text is not None else f"no instance {self.instance_id}"
        self.query_one("#explain-text", Static).update(Text(self.text))
