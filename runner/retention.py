"""Retention: which stored rows may go, given a policy and the time. Pure (no I/O).

flowrun keeps an instance while it is not terminal, whatever its age. A terminal
instance (``completed``, ``failed``, ``killed``) goes, with its attempts (their
checkpoints and kept stderr tails) and its command rows, once its last change is older
than its status's window: by default 30 days after completing, 90 after failing, 30
after a kill (:data:`DEFAULT`). A flow file may set its own windows (``retention:``), the
daemon a folder-wide default (``--retention``); a window is a duration or ``forever``.

The other kinds follow from the instances (:data:`KINDS`):

- the attempts of an instance still live are cut once they finished longer ago than its
  flow's ``completed`` window (its newest attempt always stays); the instance row then
  says from when its history is kept (``instances.history_from``);
- a sensor event goes :data:`EVENT_WINDOW` after it was handled, once no instance it
  started is left (every action it caused is done and its instances pruned);
- a worker's row goes :data:`WORKER_WINDOW` after its last heartbeat;
- a flow version goes once no instance refers to it and it is no flow's current one.

The SQL that applies these rules is ``runner.store.prune``; who runs it when,
``runner.ops.prune`` (``flowrun prune``) and ``runner.service.pruner`` (the daemon's part).
Sources: Dagu's ``hist_retention_days``, Prefect's database vacuum (terminal runs, in
batches), Stator's ``delete_after`` per state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace

from runner.durations import format_duration, parse_duration

DAY = 86400.0

#: The statuses whose instances may be pruned (every other status is live).
TERMINAL = ("completed", "failed", "killed")

#: What a prune counts, in this order. ``checkpoints`` and ``logs`` are attempts that
#: carried a checkpoint or a kept stderr tail (they go with their attempt rows).
KINDS = (
    "instances",
    "attempts",
    "checkpoints",
    "logs",
    "commands",
    "events",
    "workers",
    "versions",
)

#: Seconds a handled sensor event is kept once no instance it started is left.
EVENT_WINDOW = 30 * DAY
#: Seconds a worker's row is kept after its last heartbeat.
WORKER_WINDOW = 7 * DAY

FOREVER = "forever"


def parse_window(value: str | float | int | None) -> float | None:
    """A retention window in seconds; ``None`` for ``forever``.

    Args:
        value: a duration (``"30d"``, ``"12h"``, seconds as a number) or ``"forever"``.

    Raises:
        ValueError: anything else (the message names the accepted forms).
    """
    if isinstance(value, str) and value.strip().lower() == FOREVER:
        return None
    try:
        return parse_duration(value)  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(
            f"invalid retention {value!r}: expected a duration such as 30d, 12h, 90s, or 'forever'"
        ) from None


@dataclass(frozen=True)
class Retention:
    """How long terminal instances are kept, per status: seconds, ``None`` = forever."""

    completed: float | None = 30 * DAY
    failed: float | None = 90 * DAY
    killed: float | None = 30 * DAY

    def window(self, status: str) -> float | None:
        """The window of ``status`` (seconds or ``None``); ``None`` too for a live status."""
        return getattr(self, status) if status in TERMINAL else None

    def cutoff(self, status: str, now: float) -> float | None:
        """Instances of ``status`` last changed before this epoch time may go (``None``:
        never)."""
        w = self.window(status)
        return None if w is None else now - w

    def over(self, overrides: Mapping[str, float | None] | None) -> Retention:
        """This policy with the statuses named in ``overrides`` replaced."""
        if not overrides:
            return self
        return replace(self, **{k: v for k, v in overrides.items() if k in TERMINAL})

    def text(self) -> str:
        """``completed=30d,failed=90d,killed=30d`` (what :func:`parse_retention` reads)."""
        return ",".join(f"{f.name}={_fmt(getattr(self, f.name))}" for f in fields(self))


DEFAULT = Retention()


def _fmt(w: float | None) -> str:
    return FOREVER if w is None else format_duration(w)


def parse_retention(text: str, base: Retention = DEFAULT) -> Retention:
    """Parse ``--retention`` / ``FLOWRUN_RETENTION``.

    Args:
        text: one window for every terminal status (``"7d"``, ``"forever"``), or
            ``status=window`` pairs separated by commas (``"completed=7d,failed=forever"``);
            statuses not named keep ``base``'s windows.
        base: the policy the pairs change.

    Raises:
        ValueError: an unknown status or a bad window (one line).
    """
    text = text.strip()
    if "=" not in text:
        w = parse_window(text)
        return Retention(w, w, w)
    out: dict[str, float | None] = {}
    for part in text.split(","):
        status, eq, value = part.partition("=")
        status = status.strip()
        if not eq or status not in TERMINAL:
            raise ValueError(
                f"invalid retention {part.strip()!r}: expected STATUS=WINDOW with STATUS one "
                f"of {', '.join(TERMINAL)}"
            )
        out[status] = parse_window(value)
    return base.over(out)


@dataclass(frozen=True)
class Rules:
    """Everything a prune decides by: the policies and the fixed windows.

    Attributes:
        default: the daemon's (or ``flowrun prune``'s) policy for flows without their own.
        flows: ``{flow name: Retention}`` for flows whose file sets ``retention``.
        events: seconds handled events are kept (``None``: forever).
        workers: seconds a silent worker's row is kept.
        current: the flow versions loaded now (never pruned).
        older_than: ``flowrun prune --older-than``: one window for every terminal status
            of every flow, instead of the policies.
        log_store_max: bytes all attempt logs may take (``--log-store-max``; ``None``: no
            bound); past it the oldest terminal instances' logs go first.
    """

    default: Retention = DEFAULT
    flows: Mapping[str, Retention] | None = None
    events: float | None = EVENT_WINDOW
    workers: float = WORKER_WINDOW
    current: frozenset[str] = frozenset()
    older_than: float | None = None
    log_store_max: int | None = None

    def policy(self, flow: str) -> Retention:
        """The policy of ``flow``'s instances."""
        if self.older_than is not None:
            w = self.older_than
            return Retention(w, w, w)
        return (self.flows or {}).get(flow, self.default)

    def cutoffs(self, flow: str, now: float) -> dict[str, float]:
        """``{status: epoch cutoff}`` of the terminal statuses of ``flow`` that may be
        pruned at ``now`` (a status kept forever is absent)."""
        pol = self.policy(flow)
        return {s: c for s in TERMINAL if (c := pol.cutoff(s, now)) is not None}

    def history_cutoff(self, flow: str, now: float) -> float | None:
        """Attempts of ``flow``'s live instances that finished before this may be cut."""
        return self.policy(flow).cutoff("completed", now)

    def event_cutoff(self, now: float) -> float | None:
        """Events handled before this may go (once no instance they started is left)."""
        return None if self.events is None else now - self.events

    def newest_history_cutoff(self, flows: Iterable[str], now: float) -> float | None:
        """The latest :meth:`history_cutoff` over ``flows``: no attempt that finished
        after it can be cut, whatever its flow (``None``: none can)."""
        cuts = [c for f in flows if (c := self.history_cutoff(f, now)) is not None]
        return max(cuts) if cuts else None


def cut_attempt(
    *,
    finished_at: float | None,
    attempt: int,
    last_attempt: int,
    status: str,
    cutoff: float | None,
) -> bool:
    """Whether one attempt row of a LIVE instance goes (the history cut).

    Args:
        finished_at: when the attempt ended (``None``: still open, a checkpoint row).
        attempt: its number; ``last_attempt`` the instance's newest (``instances.attempts``).
        status: the instance's status (terminal instances go whole, never cut).
        cutoff: the flow's :meth:`Rules.history_cutoff` (``None``: kept forever).
    """
    if cutoff is None or finished_at is None or status in TERMINAL:
        return False
    return attempt < last_attempt and finished_at < cutoff
