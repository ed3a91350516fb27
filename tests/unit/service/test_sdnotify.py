"""systemd notification over a real ``AF_UNIX`` datagram socket, and the shipped unit."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runner.service.sdnotify import Notifier, notify_loop

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "contrib" / "systemd" / "flowrun.service"


def _socket(tmp: Path) -> tuple[socket.socket, str]:
    path = str(tmp / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.setblocking(False)
    return sock, path


def _drain(sock: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(sock.recv(4096).decode())
        except BlockingIOError:
            return out


def test_notifier_reads_the_environment(tmp_path: Path) -> None:
    assert not Notifier({}).enabled and not Notifier({}).send(READY=1)
    n = Notifier({"NOTIFY_SOCKET": "@abstract", "WATCHDOG_USEC": "3000000"})
    assert n.address == "\0abstract" and n.watchdog == 3.0
    assert (
        Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1"}).watchdog
        is None
    )


async def test_watchdog_only_while_healthy(tmp_path: Path) -> None:
    sock, path = _socket(tmp_path)
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    health = {"ok": True}
    stop = asyncio.Event()
    task = asyncio.ensure_future(
        notify_loop(notifier, lambda: True, lambda: health["ok"], lambda: "running 0/8", stop)
    )
    await asyncio.sleep(0.5)
    first = _drain(sock)
    assert first[0] == "READY=1\nSTATUS=running 0/8"
    assert sum(m == "WATCHDOG=1" for m in first) >= 2
    health["ok"] = False
    await asyncio.sleep(0.15)
    _drain(sock)
    await asyncio.sleep(0.5)
    assert "WATCHDOG=1" not in _drain(sock)  # unhealthy: no pings, systemd restarts us
    health["ok"] = True
    await asyncio.sleep(0.3)
    assert "WATCHDOG=1" in _drain(sock)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert _drain(sock)[-1] == "STOPPING=1\nSTATUS=stopping"
    sock.close()


def test_unit_file_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here")
    text = UNIT.read_text()
    for key in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "KillMode=mixed"):
        assert key in text
    # systemd-analyze checks that ExecStart's program exists: point it at this venv's
    flowrun = str(Path(sys.executable).parent / "flowrun")
    unit = tmp_path / "flowrun.service"
    unit.write_text(text.replace("/usr/local/bin/flowrun", flowrun))
    res = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "flowrun.service" not in res.stderr, res.stderr
    stop = int(text.split("TimeoutStopSec=")[1].split("s")[0])
    grace = float(text.split("--grace ")[1].split()[0])
    assert stop > grace
