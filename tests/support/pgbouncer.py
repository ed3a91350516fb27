"""A real PgBouncer in transaction pooling mode, as a test fixture's process.

:class:`Bouncer` writes its own ini and user list in a folder of the test's, listens on a
free loopback port, and passes every database through to one PostgreSQL server
(``auth_type = trust``, ``pool_mode = transaction``: how many managed PostgreSQL
services are reached). PgBouncer refuses to run as root: as root it drops to ``nobody``
(its ``user`` setting) after reading its files. Its log goes to ``pgbouncer.log`` in the
folder.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from sqlalchemy.engine import make_url

#: Where Debian's package installs it (``/usr/sbin`` is not on every user's PATH).
CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """The ``pgbouncer`` executable, or ``None`` when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bouncer:
    """One PgBouncer process in front of the server of ``server_url``.

    Args:
        binary: the ``pgbouncer`` executable.
        folder: an existing folder for its ini, user list and log.
        server_url: any SQLAlchemy URL of the PostgreSQL server (its host, port and user
            are used; every database name passes through).
        pool_mode: PgBouncer's ``pool_mode`` (``transaction``, ``session``).

    ``start()`` raises ``RuntimeError`` (with its log) when it does not accept
    connections within 10 s.
    """

    def __init__(
        self, binary: str, folder: Path, server_url: str, pool_mode: str = "transaction"
    ) -> None:
        server = make_url(server_url)
        self.binary, self.folder, self.server = binary, folder, server
        self.pool_mode = pool_mode
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log = folder / "pgbouncer.log"

    def url(self, server_url: str) -> str:
        """``server_url`` (a database on the server) with PgBouncer's host and port."""
        return (
            make_url(server_url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    def _write_ini(self) -> Path:
        user = self.server.username or "postgres"
        users = self.folder / "users.txt"
        users.write_text(f'"{user}" ""\n')
        lines = [
            "[databases]",
            f"* = host={self.server.host or '127.0.0.1'} port={self.server.port or 5432}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {users}",
            f"pool_mode = {self.pool_mode}",
            "max_client_conn = 500",
            "default_pool_size = 20",
            f"admin_users = {user}",
        ]
        if os.geteuid() == 0:
            lines.append("user = nobody")  # it will not run as root
        ini = self.folder / "pgbouncer.ini"
        ini.write_text("\n".join(lines) + "\n")
        return ini

    def start(self) -> None:
        """Start it on a free port and wait until it accepts connections."""
        for _ in range(5):  # another process may take the free port before it binds
            self.port = free_port()
            ini = self._write_ini()
            with self.log.open("ab") as out:
                self.proc = subprocess.Popen([self.binary, str(ini)], stdout=out, stderr=out)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                    return
                except OSError:
                    time.sleep(0.05)
            self.stop()
            if "Address already in use" not in self.log.read_text(errors="replace"):
                break
        raise RuntimeError(f"pgbouncer did not start:\n{self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL after 10 s). Safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
