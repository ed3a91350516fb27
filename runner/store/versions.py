"""Compiled flow definitions by content hash, as stored in ``flow_versions``.

Running instances keep the definition they started with: any worker, console or CLI on
any host recompiles it from the stored source (once per process and version).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.errors import FlowErrors, UserError

if TYPE_CHECKING:  # SQLAlchemy is imported where used: the CLI's SQLite reads need none
    from sqlalchemy import Connection, Engine

    from runner.flowspec.compiled import CompiledFlow

_cache: dict[str, Any] = {}
_lock = threading.Lock()


def remember(flow: CompiledFlow) -> None:
    """Seed the cache with an already compiled flow (``CompiledFlow``)."""
    _cache[flow.version] = flow


def latest(bind: Engine, flow: str) -> dict[str, Any] | None:
    """The newest stored version of the flow called ``flow`` (by ``loaded_at``): a dict of
    ``version``, ``path`` and ``loaded_at`` (epoch seconds), or ``None`` when none is stored."""
    from sqlalchemy import select

    from runner.store.db import reading
    from runner.store.tables import flow_versions

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
    flow = _cache.get(version)  # the usual case (the worker asks per claim): no imports
    if flow is not None:
        return flow
    from sqlalchemy import Connection, select

    from runner.store.db import reading
    from runner.store.tables import flow_versions

    def source() -> tuple[str, str] | None:
        q = select(flow_versions.c.source, flow_versions.c.path).where(
            flow_versions.c.version == version
        )
        if isinstance(bind, Connection):
            row = bind.execute(q).first()
        else:
            with reading(bind) as conn:
                row = conn.execute(q).first()
        return None if row is None else (row.source, row.path)

    return compile_stored(version, source)


def compile_stored(
    version: str, source: Callable[[], tuple[str, str] | None], *, imports: bool = True
) -> CompiledFlow:
    """The ``CompiledFlow`` of ``version``, compiled once per process from what
    ``source()`` reads: ``(source text, flow file path)``, or ``None`` when not stored
    (called only on a cache miss; ``runner.ops.detail.stored_flow`` reads it with the
    read side's SQL).

    ``imports=False`` imports no ``call`` module (``compile_source``'s): the flow as a
    reader shows it, compiled afresh and never cached here.

    Raises ``UserError`` when the version is not stored or no longer compiles; the
    message names the flow file.
    """
    flow = _cache.get(version)
    if flow is not None:
        return flow
    if not imports:
        return _compile(version, source, imports=False)
    with _lock:
        flow = _cache.get(version)
        if flow is not None:
            return flow
        flow = _compile(version, source, imports=True)
        _cache[version] = flow
        return flow


def _compile(
    version: str, source: Callable[[], tuple[str, str] | None], *, imports: bool
) -> CompiledFlow:
    """Compile what ``source()`` reads; ``UserError`` (exit 2) when it is not stored or
    no longer compiles."""
    from runner.flowspec.compiler import compile_source

    row = source()
    if row is None:
        raise UserError(f"flow version {version} is not stored in the database", 2)
    try:
        return compile_source(*row, imports=imports)
    except FlowErrors as exc:
        first = exc.errors[0] if exc.errors else "unknown error"
        raise UserError(f"stored flow version {version} no longer compiles: {first}", 2) from None
