"""The console's log screen (``l`` on an instance): an attempt's output, followed live.

Opens the instance's latest attempt; ``[``/``]`` step to the previous/next attempt, ``/``
searches (``n`` the next match), ``g``/``G`` top and bottom (``G`` follows new output
again), ``w`` wraps long lines, ``s`` cycles the streams shown (both, stdout, stderr).
The chunks come from the database (``runner.store.log_reader``), whichever host ran the
attempt; new ones are read every :data:`POLL` seconds while the attempt runs.

:class:`LogView` is virtualised: it renders only the rows on screen from a list of
lines (``render_line``), so a 10 MiB log costs its split into lines, not its widgets.
Every line is shown literally (``runner.literal``: an escape sequence is spelled
``\\x1b[31m``, never sent to the terminal).
"""

from __future__ import annotations

import codecs
import time

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Footer, Input, Static

from runner.literal import literal
from runner.log_buffer import END_GRACE
from runner.tui.guard import FailureLine, GuardedScreen, background, deliver

#: Seconds between two looks for new output of a running attempt.
POLL = 0.5

_STDERR = Style(color="red")
_MATCH = Style(reverse=True)
_BOLD = Style(bold=True)
_SHOW: tuple[tuple[int, ...], ...] = ((1, 2), (1,), (2,))  # the streams shown, as ``s`` cycles
_SHOW_NAMES = ("stdout+stderr", "stdout", "stderr")


class LogLines:
    """An attempt's output as lines, fed chunk by chunk (pure; no widget).

    ``lines`` holds ``(stream, text)`` with ``text`` already made literal; a chunk that
    does not end its line continues that stream's last line.
    """

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self._open: dict[int, int] = {}  # stream -> index of its unfinished line
        self._decoders: dict[int, codecs.IncrementalDecoder] = {}
        self.expected: int | None = None
        self.ended = False
        self.after = 0  # the last seq fed

    def feed(self, chunk) -> None:
        """Add one ``runner.store.log_reader.Chunk``."""
        from runner.store.log_reader import marker

        self.after = chunk.seq
        if self.expected is not None and chunk.offset > self.expected:
            self._open.clear()
            self.lines.append((0, marker(chunk.offset - self.expected)))
        self.expected = chunk.offset + len(chunk.data)
        if chunk.stream not in (1, 2):
            self.ended = True
            return
        dec = self._decoders.get(chunk.stream)
        if dec is None:
            dec = self._decoders[chunk.stream] = codecs.getincrementaldecoder("utf-8")(
                "surrogateescape"
            )
        parts = literal(dec.decode(chunk.data), lines=True).split("\n")
        last = self._open.pop(chunk.stream, None)
        if last is not None:
            stream, text = self.lines[last]
            self.lines[last] = (stream, text + parts[0])
            parts = parts[1:]
            if not parts:  # the line goes on still
                self._open[stream] = last
                return
        ended = parts and parts[-1] == ""
        if ended:
            parts.pop()  # the chunk ended its last line
        stream = chunk.stream
        self.lines.extend([(stream, part) for part in parts])
        if parts and not ended:
            self._open[stream] = len(self.lines) - 1


class LogView(ScrollView, can_focus=True):
    """The rows of a :class:`LogLines`, rendered only where they are on screen."""

    DEFAULT_CSS = "LogView { height: 1fr; }"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.source = LogLines()
        self.streams = _SHOW[0]
        self.wrap = False
        self.match: int | None = None  # the line a search found
        self._rows: list[tuple[int, int, int]] = []  # (line, start, end)
        self._width = 0

    def rebuild(self) -> None:
        """Recompute the rows (streams shown, wrap, new lines) and the virtual size."""
        width = max(1, self.scrollable_content_region.width or 80)
        rows: list[tuple[int, int, int]] = []
        longest = 0
        for i, (stream, text) in enumerate(self.source.lines):
            if stream and stream not in self.streams:
                continue
            n = len(text)
            if self.wrap and n > width:
                rows.extend((i, s, min(n, s + width)) for s in range(0, n, width))
            else:
                rows.append((i, 0, n))
                longest = max(longest, n)
        self._rows = rows
        self._width = width
        self.virtual_size = Size(width if self.wrap else longest, len(rows))
        self.refresh()

    def on_resize(self) -> None:
        if self.wrap:
            self.rebuild()

    def row_of(self, line: int) -> int:
        """The first row showing ``line`` (0 when hidden)."""
        for r, (i, _s, _e) in enumerate(self._rows):
            if i >= line:
                return r
        return 0

    def render_lines(self, crop):
        # worked out once a frame, not once a line (each walks the widget's styles)
        self._frame = (self.scroll_offset, self.scrollable_content_region.width, self.rich_style)
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        frame = getattr(self, "_frame", None)
        if frame is None:
            frame = (self.scroll_offset, self.scrollable_content_region.width, self.rich_style)
        (scroll_x, scroll_y), width, base = frame
        r = scroll_y + y
        if r >= len(self._rows):
            return Strip.blank(width, base)
        i, start, end = self._rows[r]
        stream, text = self.source.lines[i]
        piece = text[start:end] if self.wrap else text[scroll_x : scroll_x + width]
        if i == self.match:
            style = base + _MATCH
        elif stream == 2:
            style = base + _STDERR
        elif stream == 0:
            style = base + _BOLD
        else:
            style = base
        return Strip([Segment(piece, style)]).extend_cell_length(width, base)


class LogScreen(GuardedScreen):
    """The output of instance ``instance_id``'s attempts (the latest first)."""

    BINDINGS = [
        Binding("escape", "close", "Back"),
        Binding("left_square_bracket", "step(-1)", "Prev attempt"),
        Binding("right_square_bracket", "step(1)", "Next attempt"),
        Binding("slash", "search", "Search"),
        Binding("n", "next_match", "Next match", show=False),
        Binding("g", "top", "Top", show=False),
        Binding("G", "bottom", "Bottom/follow"),
        Binding("w", "wrap", "Wrap"),
        Binding("s", "streams", "Streams"),
    ]

    def __init__(self, instance_id: int, attempt: int | None = None) -> None:
        super().__init__()
        self.instance_id = instance_id
        self.attempt = attempt
        self.attempts: list[int] = []
        self.follow = True
        self.running = False
        self._unsettled = False  # ended, its last output may still be stored
        self._ended_seen: float | None = None  # when (monotonic) this screen saw the end
        self.query_text = ""
        self._generation = 0

    def compose(self):
        yield FailureLine()
        yield Static("", id="log-title")
        yield LogView(id="log-view")
        yield Input(placeholder="search (enter: find, escape: cancel)", id="log-search")
        yield Footer()

    @property
    def view(self) -> LogView:
        return self.query_one("#log-view", LogView)

    def on_mount(self) -> None:
        self.query_one("#log-search", Input).display = False
        self.view.focus()
        self._load(self._generation, self.attempt, 0)
        if self.app.refresh_interval > 0:  # a live console (not a snapshot)
            self.set_interval(POLL, self._poll)

    def _poll(self) -> None:
        if (self.running or self._unsettled) and self.attempt is not None:
            self._load(self._generation, self.attempt, self.view.source.after)

    @background("log", exclusive=True)
    def _load(self, generation: int, attempt: int | None, after: int) -> None:
        from runner.store import log_reader

        engine = self.app.data.reader
        found = log_reader.attempts_of(engine, self.instance_id) or []
        numbers = [a.attempt for a in found]
        if attempt is None and numbers:
            attempt = numbers[-1]
        chunks = []
        if attempt is not None:
            while batch := log_reader.chunks(engine, self.instance_id, attempt, after):
                chunks.extend(batch)
                after = batch[-1].seq
        info = next((a for a in found if a.attempt == attempt), None)
        running = info is not None and info.outcome is None
        deliver(self.app, self._show, generation, numbers, attempt, chunks, info, running)

    def _show(self, generation, numbers, attempt, chunks, info, running) -> None:
        if generation != self._generation:
            return  # an attempt switched meanwhile
        self.attempts, self.attempt, self.running = numbers, attempt, running
        view = self.view
        for chunk in chunks:
            view.source.feed(chunk)
        # ended, but the log writer stores its last output and end row within a batch of
        # the outcome's commit: read on until the end row, for ``END_GRACE`` at most since
        # this screen saw the end (none comes for a silent attempt: ``log_bytes`` 0; nor
        # for a lost one), as ``flowrun logs -f`` does
        ended = info is not None and not running and not view.source.ended
        if not ended or self._ended_seen is None:
            self._ended_seen = time.monotonic() if ended else None
        self._unsettled = (
            ended
            and info.log_bytes != 0
            and self._ended_seen is not None
            and time.monotonic() - self._ended_seen <= END_GRACE
        )
        if chunks or not view._rows:
            view.rebuild()
        title = f"log of instance {self.instance_id}"
        if attempt is None:
            title += ": no attempt yet"
        else:
            state = literal(info.state) if info else "?"
            how = "running" if running else (info.outcome if info else "?")
            title += f", attempt {attempt} of {len(numbers)} ({state}, {how})"
        title += f"  [{_SHOW_NAMES[_SHOW.index(view.streams)]}]"
        if self.follow:
            title += "  following"
            view.scroll_end(animate=False)
        self.query_one("#log-title", Static).update(title)

    def _reload(self, attempt: int | None) -> None:
        self._generation += 1
        self._unsettled, self._ended_seen = False, None
        streams, wrap = self.view.streams, self.view.wrap
        view = self.view
        view.source = LogLines()
        view.streams, view.wrap, view.match = streams, wrap, None
        view._rows = []
        view.rebuild()
        self._load(self._generation, attempt, 0)

    def action_step(self, step: int) -> None:
        """The previous (``-1``) or next (``1``) attempt."""
        if self.attempt is None or self.attempt not in self.attempts:
            return
        i = self.attempts.index(self.attempt) + step
        if 0 <= i < len(self.attempts):
            self._reload(self.attempts[i])

    def action_top(self) -> None:
        self.follow = False
        self.view.scroll_home(animate=False)

    def action_bottom(self) -> None:
        self.follow = True
        self.view.scroll_end(animate=False)

    def action_wrap(self) -> None:
        self.view.wrap = not self.view.wrap
        self.view.rebuild()

    def action_streams(self) -> None:
        view = self.view
        view.streams = _SHOW[(_SHOW.index(view.streams) + 1) % len(_SHOW)]
        view.rebuild()
        self._show(self._generation, self.attempts, self.attempt, [], None, self.running)

    def action_search(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.display = False
        self.query_text = event.value
        self.view.focus()
        self.view.match = None
        self.action_next_match()

    def action_next_match(self) -> None:
        """Scroll to the next line holding the search text (from the top after the last)."""
        if not self.query_text:
            return
        view = self.view
        lines = view.source.lines
        start = (view.match + 1) if view.match is not None else 0
        order = list(range(start, len(lines))) + list(range(0, start))
        needle = literal(self.query_text)
        for i in order:
            stream, text = lines[i]
            if needle in text and (not stream or stream in view.streams):
                view.match = i
                self.follow = False
                view.scroll_to(y=view.row_of(i), animate=False)
                view.refresh()
                return
        self.notify(f"not found: {needle}", severity="warning")

    def action_close(self) -> None:
        box = self.query_one("#log-search", Input)
        if box.display:
            box.display = False
            self.view.focus()
            return
        self.app.pop_screen()

    def on_key(self, event) -> None:
        if event.key in ("up", "pageup", "home") and self.follow:
            self.follow = False
