"""Command palette (``ctrl+p``) provider: every console action, searchable by name."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from runner.lifecycle import STATUSES
from runner.tui.model import SORTS

if TYPE_CHECKING:
    from runner.tui.app import FlowrunApp


class ConsoleCommands(Provider):
    """Commands on the selection, view switches, filters and sorting."""

    def _actions(self) -> list[tuple[str, str, Callable[[], object]]]:
        app = cast("FlowrunApp", self.app)  # the palette of FlowrunApp only
        sel = app.action_selection
        out: list[tuple[str, str, Callable[[], object]]] = [
            ("Pause / resume selected", "p: pause, or resume when paused", partial(sel, "toggle")),
            ("Pause selected", "pause the selected or marked instances", partial(sel, "pause")),
            ("Resume selected", "resume the selected or marked instances", partial(sel, "resume")),
            ("Kill selected", "k: kill, after a confirmation", partial(sel, "kill")),
            ("Retry selected", "r: retry failed instances", partial(sel, "retry")),
            (
                "Send event to selected",
                "s: choose an event the state accepts",
                partial(sel, "send"),
            ),
            ("View: instances", "1", partial(app.action_view, "instances")),
            ("View: workers", "2", partial(app.action_view, "workers")),
            ("View: sensors, events and commands", "3", partial(app.action_view, "events")),
            ("View: flows", "4", partial(app.action_view, "flows")),
            ("Help: all keys", "?", app.action_help),
            ("Filter: clear", "escape", partial(app.action_filter_status, "")),
        ]
        for status in STATUSES:
            out.append(
                (
                    f"Filter: status {status}",
                    "show only this status",
                    partial(app.action_filter_status, status),
                )
            )
        for sort in SORTS:
            out.append(
                (f"Sort by {sort}", "order the instances", partial(app.action_sort_by, sort))
            )
        return out

    async def discover(self) -> Hits:
        """Every action, before anything is typed."""
        for title, help_text, cb in self._actions():
            yield DiscoveryHit(title, cb, help=help_text)

    async def search(self, query: str) -> Hits:
        """Actions whose title matches ``query`` (fuzzy)."""
        matcher = self.matcher(query)
        for title, help_text, cb in self._actions():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), cb, text=title, help=help_text)
