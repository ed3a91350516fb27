"""The rows the worker's hot path passes around, and its precompiled statements.

``Claim`` (an instance claimed with its attempt open) and ``Outcome`` (what a finished
attempt writes) are shared by the claim side (``runner.store``) and the commit side
(``runner.commit``); ``hot_for(conn)`` gives the statements both run thousands of times a
second, compiled once per engine (``db.Prepared``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, Float, bindparam, func, insert, update

from .db import Prepared, json_adapter
from .models import JSONType, attempts, instances


@dataclass
class Claim:
    """One claimed instance with the attempt just opened for it (``attempt`` is 1-based)."""

    id: int
    flow: str
    version: str
    state: str
    data: dict
    fence: int
    attempt: int
    errors: int
    restarts: int
    state_errors: list[float]
    state_restarts: int
    event_id: int | None
    lost: list[str] = field(default_factory=list)
    chain: int = 0  # moves made since this instance was last claimed from the table


@dataclass
class Outcome:
    """What one finished attempt does to its instance and attempt rows.

    ``values`` holds the instance columns to write (the worker computes them from the
    flow's policy); ``attempt_values`` the attempt columns (outcome, to_state, error,
    checkpoint). ``values`` is ignored when the fence no longer matches.
    """

    instance_id: int
    attempt: int
    fence: int
    values: dict
    attempt_values: dict
    chain: Claim | None = None  # set: keep the lease and start the next attempt at once
    unchanged: tuple[str, ...] = ()  # JSON columns equal to the stored value: not rewritten


COMMIT_KEYS = (
    "state",
    "status",
    "data",
    "due_at",
    "errors",
    "restarts",
    "state_errors",
    "state_restarts",
    "last_error",
    "state_changed",
)
JSON_KEYS = ("data", "state_errors")
KEEP_IF_NONE = ("state_changed", "data", "state_errors")


class Hot:
    """The worker's hot statements, compiled once per engine (see ``db.Prepared``)."""

    def __init__(self, engine: Engine):
        self.json = json_adapter(engine)
        self.insert_attempts = Prepared(
            engine,
            insert(attempts).values(
                instance_id=bindparam("i"),
                attempt=bindparam("a"),
                state=bindparam("s"),
                worker=bindparam("w"),
                fence=bindparam("f"),
                started_at=bindparam("t"),
            ),
        )
        self.commit_instances = Prepared(
            engine,
            update(instances)
            .where(
                instances.c.id == bindparam("b_id"),
                instances.c.locked_by == bindparam("b_worker"),
                instances.c.fence == bindparam("b_fence"),
            )
            .values(
                {
                    **{k: bindparam(k) for k in COMMIT_KEYS if k not in KEEP_IF_NONE},
                    # None keeps the stored value: unchanged JSON is not rewritten
                    "state_changed": func.coalesce(
                        bindparam("state_changed", type_=Float()), instances.c.state_changed
                    ),
                    "data": func.coalesce(bindparam("data", type_=JSONType), instances.c.data),
                    "state_errors": func.coalesce(
                        bindparam("state_errors", type_=JSONType), instances.c.state_errors
                    ),
                    "locked_by": bindparam("b_lock"),
                    "locked_until": bindparam("b_until"),
                    "running_attempt": bindparam("b_next"),
                    "attempts": bindparam("b_attempts"),
                    "updated_at": bindparam("b_at"),
                }
            ),
        )
        self.commit_attempts = Prepared(
            engine,
            update(attempts)
            .where(
                attempts.c.instance_id == bindparam("b_id"),
                attempts.c.attempt == bindparam("b_attempt"),
            )
            .values(
                finished_at=bindparam("b_at"),
                outcome=bindparam("outcome"),
                to_state=bindparam("to_state"),
                error=bindparam("error"),
                checkpoint=bindparam("checkpoint"),
            ),
        )


_hot: dict[int, Hot] = {}


def hot_for(conn: Connection) -> Hot:
    engine = conn.engine
    hot = _hot.get(id(engine))
    if hot is None:
        hot = _hot[id(engine)] = Hot(engine)
    return hot
