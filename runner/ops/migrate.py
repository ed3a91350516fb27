"""Move instances to another stored version of their flow (``flowrun migrate``).

Running instances keep the version they started with (``runner.store.versions``); a
migration moves chosen ones to a newer definition. Each instance is checked on its own:

- its current state must exist in the target version, or be mapped (``OLD=NEW``) to a
  state that does; otherwise it is refused, with the states the target has;
- an attempt running now (``running_attempt`` under a valid lease) refuses it: the attempt
  would commit under the old definition (``--wait`` waits for it to end);
- a migrated instance keeps its status, data and counters; a mapped state is entered
  afresh only when the kind changes (an ``external`` or ``terminal`` state has its own
  due time and status), otherwise it is a rename. The ``fence`` is bumped, and a
  ``commands`` row ``migrate`` (``args``: ``from``, ``to``, ``from_state``, ``state``)
  audits it, so ``show`` and ``explain`` show the version change.

Airflow #48730/#52884 ask for this (definition changes under live runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from runner import lifecycle
from runner.errors import UserError
from runner.flowspec import deadlines
from runner.store.clock import db_now
from runner.store.routing import route_of
from runner.store.tables import commands, flow_versions, instances
from runner.store.versions import compiled

#: Statuses a migration leaves alone (nothing will run again).
FINISHED = ("completed", "killed")


@dataclass
class Migration:
    """The verdict for one instance.

    Attributes:
        instance_id: the instance.
        ok: migrated (or, in a dry run, would be).
        message: what happened or why not (one line).
        running: refused only because an attempt runs now (``--wait`` may retry it).
        from_version, to_version, from_state, to_state: the move.
    """

    instance_id: int
    ok: bool
    message: str
    running: bool = False
    from_version: str | None = None
    to_version: str | None = None
    from_state: str | None = None
    to_state: str | None = None


def parse_map(pairs: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``OLD=NEW`` pairs to a dict; raises ``UserError(..., 2)`` for a malformed pair."""
    out = {}
    for pair in pairs:
        old, eq, new = pair.partition("=")
        if not eq or not old.strip() or not new.strip():
            raise UserError(f"--map {pair!r}: expected OLD=NEW (state names)", 2)
        out[old.strip()] = new.strip()
    return out


def resolve_version(conn: Connection, flow: str, to: str, latest: str | None) -> str:
    """The stored version ``to`` names for ``flow``: ``latest`` (the version loaded from
    the flows folder now, ``latest``) or a stored version hash or unique prefix.

    Raises ``UserError(..., 2)`` when it names none, or more than one.
    """
    if to == "latest":
        if latest is None:
            raise UserError(f"flow {flow} is not loaded from the flows folder: no latest", 2)
        return latest
    rows = [
        r[0]
        for r in conn.execute(
            select(flow_versions.c.version).where(
                flow_versions.c.flow == flow, flow_versions.c.version.like(f"{to}%")
            )
        )
    ]
    if len(rows) != 1:
        what = "no stored version" if not rows else f"{len(rows)} stored versions"
        raise UserError(f"flow {flow}: {what} matching {to!r} (see `flowrun ls --json`)", 2)
    return rows[0]


def migrate(
    engine: Engine,
    flow: str,
    target: str,
    *,
    ids: list[int] | None = None,
    mapping: dict[str, str] | None = None,
    dry_run: bool = False,
    source: str = "cli",
    now: float | None = None,
) -> list[Migration]:
    """Migrate ``ids`` (default: every instance of ``flow`` not completed or killed and
    not already on ``target``) to stored version ``target``, in one transaction.

    Returns one :class:`Migration` per instance considered. Raises ``UserError(..., 2)``
    when ``target`` is not a stored version of ``flow`` or a mapped target state does not
    exist in it; ``UserError(..., 1)`` for an id that is not an instance of ``flow``.
    """
    mapping = mapping or {}
    with engine.begin() as conn:
        # the database's clock (``runner.store.clock``): a running attempt's lease is
        # judged as its holder set it, and the state entered is due by the workers' time
        at = db_now(conn) if now is None else now
        goal = compiled(conn, target)
        if goal.name != flow:
            raise UserError(f"version {target} is a version of flow {goal.name}, not {flow}", 2)
        bad = [new for new in mapping.values() if new not in goal.states]
        if bad:
            raise UserError(
                f"--map: version {target} has no state {bad[0]!r} "
                f"(states: {', '.join(goal.states)})",
                2,
            )
        q = select(instances).where(instances.c.flow == flow)
        if ids:
            q = q.where(instances.c.id.in_(ids))
        else:
            q = q.where(instances.c.status.not_in(FINISHED), instances.c.version != target)
        rows = {r["id"]: r for r in conn.execute(q.order_by(instances.c.id)).mappings()}
        unknown = [i for i in ids or [] if i not in rows]
        if unknown:
            raise UserError(f"no instance {unknown[0]} of flow {flow}", 1)
        out = []
        for iid, row in rows.items():
            verdict, values = _plan(conn, row, goal, mapping, at)
            out.append(verdict)
            if dry_run:
                continue
            if verdict.ok and values is not None:
                conn.execute(
                    update(instances)
                    .where(instances.c.id == iid)
                    .values(**values, fence=instances.c.fence + 1, updated_at=at)
                )
            if verdict.ok or not verdict.message.startswith("already"):
                _audit(conn, verdict, source, at)
    return out


def _plan(
    conn, row, goal, mapping: dict[str, Any], at: float
) -> tuple[Migration, dict[str, Any] | None]:
    iid, state = row["id"], row["state"]
    m = Migration(iid, False, "", from_version=row["version"], to_version=goal.version)
    m.from_state = state
    m.to_state = mapping.get(state, state)
    if row["version"] == goal.version and m.to_state == state:
        m.message = f"instance {iid}: already on version {goal.version}"
        return m, None
    if row["status"] in FINISHED:
        m.message = f"instance {iid} is {row['status']}: nothing to migrate"
        return m, None
    if m.to_state not in goal.states:
        m.message = (
            f"instance {iid}: state {state!r} does not exist in version {goal.version} "
            f"(map it: --map {state}=NEW; states: {', '.join(goal.states)})"
        )
        return m, None
    if row["running_attempt"] is not None and (row["locked_until"] or 0) >= at:
        m.running = True
        m.message = (
            f"instance {iid}: attempt {row['running_attempt']} is running on "
            f"{row['locked_by']}; migrate after it ends (--wait waits for it)"
        )
        return m, None
    values: dict[str, Any] = {"version": goal.version, "state": m.to_state}
    try:
        old_kind = compiled(conn, row["version"]).states[state].kind
    except (UserError, KeyError):
        old_kind = None
    new_kind = goal.states[m.to_state].kind
    if m.to_state != state and (new_kind != old_kind or new_kind in ("external", "terminal")):
        entered = lifecycle.enter_state(goal, m.to_state, at)
        if row["status"] in ("paused", "failed") and entered["status"] == "runnable":
            entered["status"] = row["status"]  # a paused or failed instance stays so
        values.update(entered)
        if row["start_priority"] is not None:
            values["priority"] = row["start_priority"]  # the start's wins over a state's
    # the new version's requirement of the state (``runner.labels``), moved or not
    values["runs_on"] = route_of(goal, m.to_state, row)
    if goal.has_deadlines or row["deadline_at"] is not None:  # the new version's deadlines
        since = values.get("state_changed", row["state_changed"])
        values["deadline_at"] = deadlines.on_entry(goal, m.to_state, since, row["created_at"])
    moved = f", state {state} -> {m.to_state}" if m.to_state != state else ""
    m.ok = True
    m.message = f"instance {iid}: version {row['version']} -> {goal.version}{moved}"
    return m, values


def _audit(conn: Connection, m: Migration, source: str, at: float) -> None:
    conn.execute(
        insert(commands).values(
            instance_id=m.instance_id,
            command="migrate",
            args={
                "from": m.from_version,
                "to": m.to_version,
                "from_state": m.from_state,
                "state": m.to_state,
            },
            source=source,
            created_at=at,
            status="applied" if m.ok else "refused",
            result=m.message,
        )
    )


def instances_per_version(engine: Engine) -> dict[str, dict[str, int]]:
    """``{version: {status: count}}`` over every instance (the console's flows view)."""
    from sqlalchemy import func

    from runner.store.db import reading

    out: dict[str, dict[str, int]] = {}
    q = select(instances.c.version, instances.c.status, func.count()).group_by(
        instances.c.version, instances.c.status
    )
    with reading(engine) as conn:
        for version, status, n in conn.execute(q):
            out.setdefault(version, {})[status] = n
    return out
