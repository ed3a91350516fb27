"""Prepare and run one claimed attempt: its flow version, limits, handler and checkpoints.

The worker loop (``runner.engine.worker``) decides *when* attempts run; this module decides *how*
one runs: it compiles the instance's own flow version, renders an ``exec`` argv (each
argument on its own) and environment, or builds a ``call`` handler's context, and wires
checkpoints to a fenced, durable write (``commit.save_checkpoint``).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Engine, select

from runner.errors import UserError
from runner.flowspec.setup import HandlerSetup
from runner.handlers.attempt import AttemptResult, Cancel, Context, Limits
from runner.handlers.call_handler import run_call
from runner.handlers.capture import handler_logger
from runner.handlers.environ import add_env, handler_env
from runner.handlers.exec_handler import render_argv, run_exec
from runner.handlers.process_setup import ProcSetup, ids_of, proc_setup
from runner.handlers.redact import redact_text, redact_value
from runner.handlers.secrets import SetupError, attempt_vars, working_dir
from runner.log_buffer import AttemptLog
from runner.store import commit, log_writer, rows, versions
from runner.store.db import reading
from runner.store.tables import events


async def run_attempt(
    engine: Engine,
    claim: rows.Claim,
    cancel: Cancel,
    durable: list[dict[str, Any]],
    *,
    worker_id: str,
    kill_grace: float,
    threads: Executor,
    load_event: Callable[[], Awaitable[dict[str, Any] | None]],
) -> AttemptResult:
    """Run the handler of ``claim``'s state and return what it produced (with capture on,
    its ``log_bytes``: what the handler wrote to its attempt log).

    Args:
        engine: the database (checkpoints are written through it, fenced by the claim).
        claim: the claimed instance and its running attempt.
        cancel: set by the worker to cancel the attempt (pause, kill, lost lease, stop).
        durable: a one-item list holding the data as last stored; a checkpoint replaces it.
        worker_id: this worker's id (the lock owner the checkpoint is fenced on).
        kill_grace: seconds between SIGTERM and SIGKILL for an ``exec`` process group.
        threads: the pool sync ``call`` handlers run in.
        load_event: returns the payload of the sensor event that started the instance
            (asked only when an ``exec`` argv uses ``{event.…}``).
    """
    try:
        flow, state, limits, cwd = _prepared(engine, claim.version, claim.state, kill_grace)
    except UserError as exc:
        return AttemptResult("error", claim.data, error=str(exc))
    if state is None:
        return AttemptResult(
            "error", claim.data, error=f"state {claim.state!r} has no handler to run"
        )

    try:
        env_vars, secrets = attempt_vars(state.setup, claim.data, cwd)
    except SetupError as exc:
        return AttemptResult("error", claim.data, error=str(exc))
    hidden = tuple(secrets.values())

    def checkpoint(new_data: dict[str, Any], values: dict[str, Any]) -> bool:
        if hidden:  # a secret's value is never stored
            # a dict stays a dict (each string in it redacted)
            new_data = cast("dict[str, Any]", redact_value(new_data, hidden))
            values = cast("dict[str, Any]", redact_value(values, hidden))
        with engine.begin() as conn:
            ok = commit.save_checkpoint(conn, worker_id, claim, new_data, values)
        if ok:
            durable[0] = new_data
        return ok

    writer = log_writer.writer_for(engine)

    def open_log() -> AttemptLog | None:  # once the handler is about to run
        if writer is None:
            return None
        log = writer.open(claim.id, claim.attempt, state.policy.log_max)
        log.secrets = hidden
        return log

    if state.kind == "exec":
        event = await load_event() if uses_event(state.argv) else None
        try:
            argv = render_argv(state.argv, claim.data, event)
        except KeyError as exc:
            return AttemptResult("error", claim.data, error=f"argv placeholder {exc} has no value")
        try:
            folder = working_dir(state.setup, claim.data, cwd)
            proc = _proc_setup(state.setup)
        except (SetupError, LookupError) as exc:
            return AttemptResult("error", claim.data, error=str(exc))
        setup = state.setup
        env = handler_env(
            flow.name,
            claim.state,
            claim.id,
            claim.attempt,
            cwd,
            setup.inherit,
            setup.secret_sources,
        )
        if env_vars or secrets:
            add_env(env, {**env_vars, **secrets})
        log = open_log()
        result = await run_exec(
            argv,
            cwd=folder,
            env=env,
            data=claim.data,
            limits=limits,
            cancel=cancel,
            checkpoint=checkpoint,
            next_state=state.next,
            secrets=tuple(os.fsencode(v) for v in hidden),
            setup=proc,
            limits_given=state.setup.limits,
            log=log,
        )
    else:
        log = open_log()
        ctx = Context(
            data=own_copy(claim.data),
            instance_id=claim.id,
            flow=flow.name,
            state=claim.state,
            attempt=claim.attempt,
            env=env_vars,
            secrets=secrets,
            log=handler_logger(flow.name, claim.state),
            _attempt_log=log,
            _checkpoint=checkpoint,
        )
        result = await run_call(
            state.func, ctx, limits=limits, cancel=cancel, threads=threads, next_state=state.next
        )
    if log is not None:
        result.log_bytes = log.end()  # ended by the handler's run: its byte count
    return redacted(result, hidden) if hidden else result


def _proc_setup(setup: HandlerSetup) -> ProcSetup | None:
    """What the handler's process is set up with before its ``exec`` (``None``: nothing).
    Raises ``LookupError`` naming an unknown user or group."""
    if not setup.limits and setup.user is None and setup.group is None:
        return None
    return proc_setup(setup.limits, *ids_of(setup.user, setup.group))


def redacted(result: AttemptResult, secrets: tuple[str, ...]) -> AttemptResult:
    """``result`` with every secret value in its error text, data and checkpoint replaced
    by ``***`` (``runner.handlers.redact``): what is stored of an attempt never holds one."""
    if result.error:
        result.error = redact_text(result.error, secrets)
    result.data = redact_value(result.data, secrets)  # type: ignore[assignment]
    if result.checkpoint is not None:
        result.checkpoint = redact_value(result.checkpoint, secrets)  # type: ignore[assignment]
    return result


_prepared_cache: dict[tuple[str, str, float], tuple[Any, ...]] = {}


def _prepared(engine: Engine, version: str, state_name: str, kill_grace: float) -> tuple[Any, ...]:
    """``(flow, state, limits, cwd)`` of one state of one flow version, worked out once per
    process (a version never changes); ``state`` is ``None`` when the state has no handler.

    Raises ``UserError`` when the version is not stored or no longer compiles.
    """
    key = (version, state_name, kill_grace)
    found = _prepared_cache.get(key)
    if found is None:
        flow = versions.compiled(engine, version)
        state = flow.states.get(state_name)
        if state is None or state.kind not in ("exec", "call"):
            return flow, None, None, None
        limits = Limits(state.policy.timeout, state.policy.keepalive, kill_grace)
        found = _prepared_cache[key] = (flow, state, limits, flow_dir(flow.path))
    return found


def load_event_payload(engine: Engine, event_id: int | None) -> dict[str, Any] | None:
    """The payload of sensor event ``event_id`` (``None`` when there is none)."""
    if event_id is None:
        return None
    with reading(engine) as conn:
        return conn.execute(select(events.c.payload).where(events.c.id == event_id)).scalar()


@functools.lru_cache(maxsize=256)
def flow_dir(path: str) -> Path:
    """The folder of a flow file: the working directory of its ``exec`` handlers."""
    return Path(path).resolve().parent


def own_copy(data: dict[str, Any]) -> dict[str, Any]:
    """A copy the handler may change freely: nested values are copied too (else a change
    deep inside would also change the claim's data and look like no change at all)."""
    for v in data.values():
        if isinstance(v, (dict, list)):
            return copy.deepcopy(data)
    return dict(data)


def uses_event(argv: tuple[str, ...] | None) -> bool:
    """True when an argv has an ``{event.…}`` placeholder."""
    return any("{event." in a for a in argv or ())
