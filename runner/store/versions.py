"""Compiled flow definitions by content hash, as stored in ``flow_versions``.

Running instances keep the definition they started with: any worker, console or CLI on
any host recompiles it from the stored source (once per process and version).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, select

from runner.errors import FlowErrors, UserError
from runner.store.db import reading
from runner.store.tables import flow_versions

if TYPE_CHECKING:
    from runner.flowspec.compiled import CompiledFlow

_cache: dict[str, Any] = {}
_lock = threading.Lock()


def remember(flow: CompiledFlow) -> None:
    """Seed the cache with an already compiled flow (``CompiledFlow``)."""
    _cache[flow.version] = flow


def latest(bind: Engine, flow: str) -> dict[str, Any] | None:
    """The newest stored version of the flow called ``flow`` (by ``loaded_at``): a dict of
    ``version``, ``path`` and ``loaded_at`` (epoch seconds), or ``None`` when none is stored."""
    q = (
        select(flow_versions.c.version, flow_versions.c.path, flow_versions.c.loaded_at)
        .where(flow_versions.c.flow == flow)
        .order_by(flow_versions.c.loaded_at.desc())
        .limit(1)
    )
    with reading(bind) as conn:
        row = conn.execute(q).mappings().first()
    return dict(row) if row is not None else None


def compiled(bind: Engine | Connection, version: str) -> CompiledFlow:
    """Return the ``CompiledFlow`` of ``version``.

    ``bind`` is an engine, or the connection of a transaction in progress (a SQLite
    write transaction must not open a second connection: it would wait on itself).

    Raises ``UserError`` when the version is not stored or no longer compiles (for
    example, its ``call`` module was deleted); the message names the flow file.
    """
    flow = _cache.get(version)
    if flow is not None:
        return flow
    with _lock:
        flow = _cache.get(version)
        if flow is not None:
            return flow
        from runner.flowspec.compiler import compile_source

        q = select(flow_versions.c.source, flow_versions.c.path).where(
            flow_versions.c.version == version
        )
        if isinstance(bind, Connection):
            row = bind.execute(q).first()
        else:
            with reading(bind) as conn:
                row = conn.execute(q).first()
        if row is None:
            raise UserError(f"flow version {version} is not stored in the database", 2)
        try:
            flow = compile_source(row.source, row.path)
        except FlowErrors as exc:
            first = exc.errors[0] if exc.errors else "unknown error"
            raise UserError(
                f"stored flow version {version} no longer compiles: {first}", 2
            ) from None
        _cache[version] = flow
        return flow
