"""Delivering alerts: the rules' ``exec`` and ``webhook`` actions, retried with backoff.

Every daemon with sensors runs a :class:`Deliverer` (a part of the sensor hub). Its own
rules hand it the deliveries they queue, already claimed by it in their transaction
(:meth:`Deliverer.hand`); it claims the others due (retries, another daemon's, a dead
one's) under a lease (``runner.store.deliveries.claim_due``, :data:`BATCH` at a time),
sends them (the ``exec`` ones at once, :data:`EXECS_AT_ONCE` at most; the webhooks one
thread per receiver, each receiver's one after the other on a kept-alive connection,
``runner.sensors.http_out``), and records the batch's results in one transaction. A
failure (non-zero exit, connection error, timeout, HTTP 5xx, HTTP 429, honouring
``Retry-After``) is retried with backoff (:data:`BACKOFF_FIRST` doubling up to
:data:`BACKOFF_MAX`) until the rule's ``retry_for`` has passed; any other HTTP status (a
4xx) fails at once. A failed delivery is one WARNING line. Each send carries the event id:
``Idempotency-Key`` header, ``FLOWRUN_EVENT_ID`` environment variable, so receivers can
drop the repeats of "at least once".

``exec`` runs its argv (never a shell) in the rule's flow folder with the event as JSON on
stdin (:data:`EXEC_TIMEOUT` seconds at most); exit 0 is delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http.client
import json
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from runner.sensors.base import first_of, log
from runner.sensors.http_out import Receivers, receiver
from runner.sensors.rule_actions import describe_target
from runner.store.clock import db_now
from runner.store.deliveries import Claimed, Try, claim_due, finish, next_due
from runner.templating import render
from runner.warn_line import warn

#: Seconds an ``exec`` notifier may run before it is killed (a failure, retried).
EXEC_TIMEOUT = 60.0
#: First retry delay, seconds (doubled per failure).
BACKOFF_FIRST = 1.0
#: Longest retry delay, seconds.
BACKOFF_MAX = 30.0
#: Longest sleep between looks for deliveries queued by other daemons (or left by a dead
#: one), seconds; a rule of this daemon kicks the deliverer at once.
LOOK_EVERY = 15.0
#: A webhook response body kept in ``last_result`` (characters).
RESULT_CHARS = 200
#: Deliveries claimed at a time (one transaction to claim them, one to record their tries).
BATCH = 200
#: Seconds one receiver's claimed webhooks are posted one after the other; those left when
#: they are up (a slow or silent receiver) are given back untried, due at once.
SERIAL_FOR = 5.0
#: Seconds a claimed delivery is held (its lease): an ``exec`` may run :data:`EXEC_TIMEOUT`.
LEASE = EXEC_TIMEOUT + 30.0
#: ``exec`` notifiers run at once at most.
EXECS_AT_ONCE = 32
#: The ``User-Agent`` of webhooks (unless the rule's ``headers`` name one).
USER_AGENT = "flowrun"


def event_document(c: Claimed) -> dict[str, Any]:
    """What a delivery sends: the event's payload plus ``event_id``, ``sensor`` and
    ``suppressed`` (events of its ``once_per`` key folded since the key's previous
    delivery)."""
    return {"event_id": c.event_id, "sensor": c.sensor, **c.payload, "suppressed": c.folded_before}


class Outcome:
    """One try's result: text, delivered, and a retry delay from the receiver (s)."""

    def __init__(
        self, text: str, delivered: bool, *, retry: bool = True, after: float | None = None
    ):
        self.text, self.delivered, self.retry, self.after = text, delivered, retry, after


class Deliverer:
    """Sends the deliveries due, in one daemon.

    Args:
        engine: the database.
        registry: the ``FlowRegistry`` (a rule's flow folder is an ``exec``'s working folder).
        worker_id: this daemon's id (the lease holder).
        environ: the environment ``{env.X}`` headers and ``exec`` read (default: the
            daemon's own).
    """

    def __init__(
        self, engine: Engine, registry: Any, worker_id: str, environ: dict[str, str] | None = None
    ) -> None:
        self.engine = engine
        self.registry = registry
        self.worker_id = worker_id
        self.environ = dict(os.environ if environ is None else environ)
        self._kick = asyncio.Event()
        #: kept-alive connections to the webhooks' receivers
        self.receivers = Receivers()
        self._execs = asyncio.Semaphore(EXECS_AT_ONCE)
        #: deliveries sent and delivered / failed for good (metrics, tests)
        self.delivered = 0
        self.failed = 0
        #: deliveries this daemon's rules queued already claimed by it (:meth:`hand`)
        self._handed: list[Claimed] = []

    def kick(self) -> None:
        """Look for due deliveries now (a rule of this daemon queued one)."""
        self._kick.set()

    def hand(self, claimed: list[Claimed]) -> None:
        """Send ``claimed`` (queued by this daemon's rules already claimed by it, for
        :data:`LEASE` seconds) with the next batch, without claiming them again."""
        if claimed:
            self._handed += claimed
            self._kick.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop`` is set; a database error ends it (``keep`` restarts it)."""
        try:
            await self._deliver_until(stop)
        finally:
            self.receivers.close()

    def give_back(self) -> None:
        """Give back the handed deliveries not sent (blocking: at the daemon's stop), due
        at once for any daemon instead of when their lease expires."""
        handed, self._handed = self._handed, []
        finish(self.engine, self.worker_id, [Try(c.id, "", False, tried=False) for c in handed])

    async def _deliver_until(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._kick.clear()
            handed, self._handed = self._handed[:BATCH], self._handed[BATCH:]
            # the others due too (retries, another daemon's): a read when none is
            claimed = handed + await asyncio.to_thread(
                claim_due, self.engine, self.worker_id, LEASE, BATCH
            )
            if claimed:
                tries = await self._send(claimed)
                statuses = await asyncio.to_thread(finish, self.engine, self.worker_id, tries)
                for c, x, status in zip(claimed, tries, statuses, strict=True):
                    if status == "delivered":
                        self.delivered += 1
                    elif status == "failed":
                        self.failed += 1
                        self._warn(c, x.result)
                continue
            due = await asyncio.to_thread(next_due, self.engine)
            # due times are the database's (``runner.store.clock``), as are the leases
            wait = (
                LOOK_EVERY if due is None else min(LOOK_EVERY, max(due - db_now(self.engine), 0.01))
            )
            await first_of(self._kick.wait(), stop.wait(), timeout=wait)

    async def _send(self, claimed: list[Claimed]) -> list[Try]:
        """One try of each of ``claimed``, in its order: the execs at once, the webhooks
        one thread per receiver (scheme, host and port), each receiver's serially on its
        kept-alive connection; a receiver's requests past :data:`SERIAL_FOR` seconds are
        given back untried (due at once)."""
        hooks: dict[tuple[str, str, int], list[Claimed]] = {}
        for c in claimed:
            if "exec" not in c.target:
                hooks.setdefault(receiver(str(c.target["webhook"].get("url"))), []).append(c)
        execs = [self._tried(c, self._exec(c)) for c in claimed if "exec" in c.target]
        posted = asyncio.gather(
            *(asyncio.to_thread(self._post_serially, g) for g in hooks.values())
        )
        done = [*await asyncio.gather(*execs), *(x for g in await posted for x in g)]
        by_id = {x.delivery_id: x for x in done}
        return [by_id[c.id] for c in claimed]

    def _post_serially(self, group: list[Claimed]) -> list[Try]:
        """Post ``group`` (one receiver's) one after the other (in a thread)."""
        until = time.monotonic() + SERIAL_FOR
        out = []
        for c in group:
            if time.monotonic() > until:
                out.append(Try(c.id, "", False, tried=False))
                continue
            try:
                got = self._webhook(c)
            except Exception as exc:  # noqa: BLE001 - any failure of a try is recorded, retried
                got = Outcome(f"error: {exc}", False)
            out.append(self._try(c, got))
        return out

    async def _tried(self, c: Claimed, sending: Awaitable[Outcome]) -> Try:
        """The :class:`Try` of ``c`` once ``sending`` (its exec) ends."""
        try:
            got = await sending
        except Exception as exc:  # noqa: BLE001 - any failure of a try is recorded, retried
            got = Outcome(f"error: {exc}", False)
        return self._try(c, got)

    def _try(self, c: Claimed, out: Outcome) -> Try:
        """One try's outcome ``out`` as a :class:`Try` to record (the batch's tries are
        recorded together by ``run``), due again after its backoff: by the database's
        clock, as its ``give_up_at`` and every lease (a host whose clock is off would
        otherwise retry early or give up early)."""
        delay = min(BACKOFF_FIRST * 2**c.attempts, BACKOFF_MAX)
        if out.after is not None:
            delay = max(out.after, 0.0)
        retry_at = db_now(self.engine) + delay if out.retry else None
        return Try(c.id, out.text, out.delivered, retry_at)

    def _warn(self, c: Claimed, text: str) -> None:
        p = c.payload
        warn(
            log,
            p.get("instance"),
            p.get("flow"),
            p.get("state"),
            "delivery_failed",
            f"delivery {c.id} ({describe_target(c.target)}, event {c.event_id}, "
            f"{p.get('kind')}) failed for good after {c.attempts + 1} tries: {text}",
            event=c.event_id,
        )

    async def _exec(self, c: Claimed) -> Outcome:
        async with self._execs:
            return await self._run_exec(c)

    async def _run_exec(self, c: Claimed) -> Outcome:
        argv = [str(a) for a in c.target["exec"]]
        flow = self.registry.flows.get(c.rule.removeprefix("rule:").partition("#")[0])
        cwd = Path(str(flow.path)).parent if getattr(flow, "path", None) else None
        env = {**self.environ, "FLOWRUN_EVENT_ID": str(c.event_id)}
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return Outcome(f"cannot run {argv[0]}: {exc.strerror or exc}", False)
        document = json.dumps(event_document(c)).encode()
        try:
            _, err = await asyncio.wait_for(proc.communicate(document), EXEC_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return Outcome(f"timed out after {EXEC_TIMEOUT:g}s", False)
        if proc.returncode == 0:
            return Outcome("exit 0", True)
        lines = [ln for ln in err.decode(errors="replace").splitlines() if ln.strip()]
        tail = f": {lines[-1].strip()[:RESULT_CHARS]}" if lines else ""
        return Outcome(f"exit {proc.returncode}{tail}", False)

    def _webhook(self, c: Claimed) -> Outcome:
        hook = c.target["webhook"]
        context = {"event": c.payload, "env": self.environ}
        try:
            headers = {k: render(v, context) for k, v in (hook.get("headers") or {}).items()}
        except KeyError as exc:
            return Outcome(f"a header names {{{exc.args[0]}}}, which is not set", False)
        body = hook.get("body")
        if body is None:
            data = json.dumps(event_document(c)).encode()
            headers.setdefault("Content-Type", "application/json")
        else:
            data = body.encode()
        headers["Idempotency-Key"] = str(c.event_id)
        headers.setdefault("User-Agent", USER_AGENT)
        method = hook.get("method") or "POST"
        try:
            answer = self.receivers.send(
                hook["url"],
                method,
                None if method == "GET" else data,
                headers,
                float(hook.get("timeout") or 10),
            )
        except (OSError, http.client.HTTPException) as exc:
            return Outcome(f"cannot reach {hook['url']}: {exc}", False)
        code = answer.status
        text = f"HTTP {code}"
        if 200 <= code < 300:
            return Outcome(text, True)
        if code == 429 or code >= 500:
            return Outcome(text, False, after=_retry_after(answer.headers.get("Retry-After")))
        return Outcome(text, False, retry=False)


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds, or an HTTP date), capped at an hour;
    ``None`` when absent or unreadable."""
    if not value:
        return None
    try:
        return min(float(value), 3600.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(max(when.timestamp() - time.time(), 0.0), 3600.0)
