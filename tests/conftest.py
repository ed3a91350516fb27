"""Shared fixtures: ``pg_url``, a fresh PostgreSQL database per test, and ``pgbouncer_url``,
the same database through a real PgBouncer in transaction pooling mode.

The server is ``FLOWRUN_TEST_PG`` (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``,
an admin connection used only to create and drop databases). When it cannot be reached the
test is skipped with the reason; set ``FLOWRUN_PG_REQUIRED=1`` (as CI does) to make that a
failure instead, so a missing server never passes silently.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import pytest

ADMIN_URL = os.environ.get("FLOWRUN_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _libpq(url: str) -> str:
    """``postgresql+psycopg://...`` → the ``postgresql://...`` conninfo psycopg takes."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def _admin(connect_timeout: int = 5):
    import psycopg

    return psycopg.connect(_libpq(ADMIN_URL), autocommit=True, connect_timeout=connect_timeout)


@pytest.fixture(autouse=True)
def _server_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test shares the machine's PostgreSQL server; one marked ``server_alone``
    (it restarts the server, or takes most of its connections) runs with no other test
    meanwhile, whatever the number of pytest-xdist workers (``tests.support.server_lock``)."""
    from tests.support import server_lock

    hold = (
        server_lock.alone if request.node.get_closest_marker("server_alone") else server_lock.shared
    )
    with hold():
        yield


def _unreachable(reason: str) -> None:
    if os.environ.get("FLOWRUN_PG_REQUIRED") == "1":
        pytest.fail(f"PostgreSQL required (FLOWRUN_PG_REQUIRED=1) but {reason}")
    pytest.skip(reason)


def pg_database_url(name: str) -> str:
    """The SQLAlchemy URL of database ``name`` on the test server."""
    base, _, _ = ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A new, empty PostgreSQL database (``flowrun_test_<random>``), dropped afterwards.

    Yields its ``postgresql+psycopg://`` URL. Skips (or fails, with
    ``FLOWRUN_PG_REQUIRED=1``) when the server cannot be reached.
    """
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        _unreachable("psycopg is not installed")
    try:
        admin = _admin()
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _unreachable(f"PostgreSQL server not reachable at {_redacted(ADMIN_URL)}: {first}")
    name = f"flowrun_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_database_url(name)
    finally:
        _drop(name)


def _drop(name: str, patience: float = 60.0) -> None:
    """Drop database ``name``, retrying while the server restarts (a test may restart it)."""
    import psycopg

    deadline = time.monotonic() + patience
    while True:
        try:
            with _admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _redacted(url: str) -> str:
    from runner.store.db import redact

    return redact(url)


@pytest.fixture(params=["c", "python"])
def spawn_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run an ``exec`` handler test on both ways of starting a handler: the C extension
    ``runner.handlers._spawn`` (skipped where it is not built, or with
    ``FLOWRUN_SPAWN=python``) and the Python path (``_posixsubprocess`` on spawn threads,
    what a machine without a compiler runs)."""
    from runner.handlers import native

    if request.param == "c":
        if native.ext is None:
            reason = f"C spawn path not in use: {native.path_in_use()}"
            if os.environ.get("FLOWRUN_SPAWN_REQUIRED") == "1":  # CI: the build must work
                pytest.fail(f"C spawn path required (FLOWRUN_SPAWN_REQUIRED=1) but {reason}")
            pytest.skip(reason)
    else:
        monkeypatch.setattr(native, "ext", None)
    return request.param


@pytest.fixture
def pgbouncer_url(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``pg_url``'s database reached through a real PgBouncer in transaction pooling mode
    (``tests.support.pgbouncer.Bouncer``: its own ini on a free port, ``auth_type =
    trust``), stopped afterwards.

    Skips when the ``pgbouncer`` binary is not installed (``apt-get install pgbouncer``),
    or fails with ``FLOWRUN_PG_REQUIRED=1`` (as CI does), as the PostgreSQL fixtures do.
    """
    from tests.support.pgbouncer import Bouncer, pgbouncer_binary

    binary = pgbouncer_binary()
    if binary is None:
        _unreachable("pgbouncer is not installed (apt-get install pgbouncer)")
    bouncer = Bouncer(binary, tmp_path_factory.mktemp("pgbouncer"), ADMIN_URL)
    bouncer.start()
    try:
        yield bouncer.url(pg_url)
    finally:
        bouncer.stop()
