"""The values the console's data layer hands to its screens: what the instances view asks
for (``Query``) and what comes back (``Page`` of ``Row``, ``Counts``, ``Detail``,
``FlowsInfo``). Plain data, no database access; times are float seconds since the epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow
    from runner.flowspec.policy import Policy

#: Sort keys offered by the console, in the order ``o`` cycles through them.
SORTS = ("id", "flow", "state", "status", "attempts", "restarts", "errors", "due")


@dataclass(frozen=True)
class Query:
    """What the instances view shows: filters and order.

    Attributes:
        status: only instances in this status, or ``None`` for all.
        flow: only instances of this flow, or ``None`` for all.
        text: a case-insensitive substring of flow, label, state, status, last error or data
            (an all-digit text also matches that id); ``""`` for no text filter.
        sort: one of ``SORTS`` (an unknown key orders by ``id``).
        desc: descending order.
    """

    status: str | None = None
    flow: str | None = None
    text: str = ""
    sort: str = "id"
    desc: bool = False

    def with_(self, **changes: Any) -> Query:
        """A copy with ``changes`` (field name to value) applied; raises ``TypeError`` on an
        unknown field."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Row:
    """One instance as the instances view needs it (raw values, formatted at render).

    Times (``locked_until``, ``due_at``, ``state_errors``) are float seconds since the
    epoch; ``max_errors``/``window`` (seconds) are the state's error budget, ``None`` when
    its flow version cannot be compiled; ``label`` is the instance's label (flow ``label:``);
    ``waits_for`` the ``on:`` events of its state when that state is external (moved by
    events only), ``None`` when it is not or its flow version cannot be compiled.
    """

    id: int
    flow: str
    version: str
    state: str
    status: str
    locked_by: str | None
    locked_until: float | None
    attempts: int
    errors: int
    restarts: int
    state_errors: tuple[float, ...]
    due_at: float | None
    last_error: str | None
    max_errors: int | None = None
    window: float | None = None
    label: str | None = None
    waits_for: tuple[str, ...] | None = None
    waiting_for: str | None = None  # the pool (or rate) it waits for (``store.pools``)


@dataclass
class Page:
    """Rows ``offset .. offset+len(rows)`` of ``query``'s ordering.

    Attributes:
        query: the query the rows answer.
        offset: the absolute position of ``rows[0]``.
        rows: the rows, in the query's order.
        limit: how many rows were asked for.
        elapsed: seconds the read took.
    """

    query: Query
    offset: int
    rows: list[Row]
    limit: int
    elapsed: float = 0.0

    def get(self, index: int) -> Row | None:
        """The row at absolute position ``index`` when this page holds it, else ``None``."""
        i = index - self.offset
        return self.rows[i] if 0 <= i < len(self.rows) else None

    def nearest_before(self, index: int) -> tuple[int, int] | None:
        """``(position, id)`` of the held row closest before absolute position ``index``
        (within 2 pages), or ``None``; raises nothing."""
        if not self.rows or index <= self.offset:
            return None
        pos = min(index - 1, self.offset + len(self.rows) - 1)
        if index - pos > 2 * max(self.limit, 1):
            return None
        return pos, self.rows[pos - self.offset].id

    @property
    def exhausted(self) -> bool:
        """True when the page ended before its limit: nothing follows it."""
        return len(self.rows) < self.limit


@dataclass
class Counts:
    """Counts per status in the current flow scope and the total matching the filters.

    Attributes:
        by_status: ``{status: count}`` for every status (zeros included).
        total: instances matching the whole query.
        elapsed: seconds the counting took.
    """

    by_status: dict[str, int]
    total: int
    elapsed: float = 0.0


@dataclass
class Detail:
    """Everything the detail screen shows about one instance.

    Attributes:
        row: the ``instances`` row (column name to value).
        attempts: its newest attempt rows, newest first.
        commands: its newest command rows, newest first.
        flow: the ``CompiledFlow`` of its version, or ``None`` when unavailable.
        flow_error: why ``flow`` is unavailable (one line), or ``None``.
        policy: the current state's ``Policy``, or ``None``.
    """

    row: dict[str, Any]
    attempts: list[dict[str, Any]]
    commands: list[dict[str, Any]]
    flow: CompiledFlow | None = None
    flow_error: str | None = None
    policy: Policy | None = None


@dataclass
class FlowsInfo:
    """Loaded flows (from the flows folder) and stored flow versions.

    Attributes:
        loaded: one dict per loaded flow: ``name``, ``version``, ``states``, ``sensors``,
            ``rules`` (counts) and ``path``.
        errors: the flows folder's load errors, one line each (``file:line:col: message``).
        versions: stored versions: ``version``, ``flow``, ``path``, ``loaded_at`` and
            ``instances`` (``{status: count}`` of the instances on that version).
        note: why the loaded list is empty or partial, or ``None``.
    """

    loaded: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    versions: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None
