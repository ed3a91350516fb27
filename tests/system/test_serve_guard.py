"""``flowrun serve`` is safe by default: a real ``flowrun serve`` process, a real SQLite
file, and a real websocket client (aiohttp) playing a foreign page, a re-bound DNS name,
a caller without the token, a fifth browser tab and an idle one.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.fault import Flowrun, poll, write_flow
from tests.support.serving import (
    FLOW,
    TOKEN,
    Served,
    cmdline,
    printed_token,
    serving,
    status,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def fr(tmp_path: Path) -> Flowrun:
    """A flows folder with one flow and one instance waiting in it."""
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "web", FLOW)
    assert fr("start", "web").returncode == 0
    return fr


@pytest.fixture
def served(fr: Flowrun) -> Iterator[Served]:
    """``flowrun serve`` with the defaults and ``--token TOKEN``."""
    with serving(fr) as server:
        yield server


def ws_url(server: Served, token: str | None = TOKEN) -> str:
    """The console's websocket URL (with ``?token=`` unless ``None``)."""
    url = server.base.replace("http", "ws", 1) + "/ws?width=100&height=30"
    return url + (f"&token={token}" if token else "")


async def refused(url: str, **headers: str) -> int:
    """The status a websocket handshake to ``url`` is refused with (fails if accepted)."""
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
            await session.ws_connect(url, headers=headers)
    return caught.value.status


async def drawn(ws: aiohttp.ClientWebSocketResponse, word: str, timeout: float = 90) -> None:
    """Read the console's output until ``word`` appears in it."""
    out = b""
    async with asyncio.timeout(timeout):
        while word.encode() not in out:
            msg = await ws.receive()
            assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), msg
            out += msg.data if isinstance(msg.data, bytes) else msg.data.encode()


async def closed_by_server(ws: aiohttp.ClientWebSocketResponse, timeout: float = 60) -> None:
    """Read a session (answering the server's heartbeat) until it is closed."""
    async with asyncio.timeout(timeout):
        async for _ in ws:
            pass


async def test_a_foreign_origin_is_refused(served: Served) -> None:
    own = f"http://127.0.0.1:{served.port}"
    assert await refused(ws_url(served), Origin="http://evil.example") == 403
    assert await refused(ws_url(served), Origin=f"http://127.0.0.1:{served.port + 1}") == 403
    assert await refused(ws_url(served), Origin="null") == 403
    assert "Origin 'http://evil.example' is not this server's page" in served.text()
    # the page's own origin gets the console
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(ws_url(served), headers={"Origin": own}) as ws:
            await drawn(ws, "STATUS")


async def test_a_foreign_host_is_refused(served: Served) -> None:
    # DNS rebinding: evil.example resolves to 127.0.0.1, the browser sends its own name
    host = f"evil.example:{served.port}"
    assert await refused(ws_url(served), Host=host) == 403
    assert await refused(ws_url(served), Host=host, Origin=f"http://{host}") == 403
    assert status(f"{served.base}/?token={TOKEN}", Host=host) == 403
    assert status(f"{served.base}/?token={TOKEN}", Host=f"localhost:{served.port}") == 200


async def test_no_token_no_session_even_on_loopback(fr: Flowrun) -> None:
    with serving(fr, token=None) as served:  # loopback, no --token given
        token = printed_token(served)
        assert await refused(ws_url(served, None)) == 401
        assert await refused(ws_url(served, "wrong-token-wrong-token")) == 401
        # the page's /?token=T sets the cookie its websocket then presents
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as session:
            async with session.get(f"{served.base}/?token={token}") as page:
                assert page.status == 200
                cookie = page.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
            async with session.ws_connect(ws_url(served, None)) as ws:
                await drawn(ws, "STATUS")


async def test_a_fifth_session_is_refused(served: Served) -> None:
    async with aiohttp.ClientSession() as session:
        tabs = [await session.ws_connect(ws_url(served)) for _ in range(4)]
        readers = [asyncio.create_task(closed_by_server(ws, 240)) for ws in tabs]
        assert await refused(ws_url(served)) == 503
        await asyncio.to_thread(poll, lambda: len(served.consoles()) == 4, 90, what="4 consoles")
        # each observes and commands only (--attach): no worker per browser tab
        for pid in served.consoles():
            assert b"--attach" in cmdline(pid).split(b"\0"), cmdline(pid)
        await tabs.pop().close()
        # its console quits and its place frees
        await asyncio.to_thread(poll, lambda: len(served.consoles()) == 3, 90, what="3 consoles")

        async def fifth() -> aiohttp.ClientWebSocketResponse | None:
            try:
                return await session.ws_connect(ws_url(served))
            except aiohttp.WSServerHandshakeError:
                await asyncio.sleep(0.2)
                return None

        deadline = asyncio.get_running_loop().time() + 60
        while (ws := await fifth()) is None:
            assert asyncio.get_running_loop().time() < deadline, "no place freed"
        tabs.append(ws)
        for ws in tabs:
            await ws.close()
        await asyncio.gather(*readers)


async def test_an_idle_session_is_closed(fr: Flowrun) -> None:
    # the idle timeout is above textual-serve's 15 s heartbeat: its pongs are no input
    with serving(fr, "--idle-timeout", "20s") as server:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(ws_url(server)) as ws:
                reader = asyncio.create_task(closed_by_server(ws, 240))  # pongs the heartbeat
                # a browser that keeps sending keeps its session: 25 s of pings
                loop = asyncio.get_running_loop()
                until = loop.time() + 25
                while loop.time() < until:
                    await ws.send_json(["ping", "1"])
                    last_sent = loop.time()
                    await asyncio.sleep(2)
                assert not reader.done()
                # then silence: closed by the server 20 s after the last message, saying why
                await reader
                assert 19 < loop.time() - last_sent < 60
                assert ws.close_code == aiohttp.WSCloseCode.GOING_AWAY
        await asyncio.to_thread(poll, lambda: not server.consoles(), 60, what="console gone")
        assert "closed a session idle for 20s" in server.text()


async def test_a_plain_get_on_the_websocket_path_is_no_traceback(served: Served) -> None:
    assert status(f"{served.base}/ws?token={TOKEN}") == 400
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{served.base}/ws?token={TOKEN}") as resp:
            assert "/ws takes a websocket handshake" in await resp.text()
    # a handshake asking for no terminal size
    assert await refused(ws_url(served).replace("width=100", "width=wide")) == 400
    assert "Traceback" not in served.text()


#: Messages textual-serve's page never sends: not JSON, not a list, a key that is no
#: text, a lone surrogate, a size that is no number.
MALFORMED = (
    "not json",
    "{}",
    "[]",
    '["stdin", 5]',
    '["stdin", "\\ud800"]',
    '["resize", {"width": "x", "height": 30}]',
    '["resize", [100, 30]]',
    '["ping"]',
)


async def test_a_malformed_message_closes_its_session_in_one_line(fr: Flowrun) -> None:
    with serving(fr, "--max-sessions", str(len(MALFORMED) + 1)) as served:
        async with aiohttp.ClientSession() as session:
            for text in MALFORMED:
                async with session.ws_connect(ws_url(served)) as ws:
                    await ws.send_str(text)
                    await closed_by_server(ws)
                    assert ws.close_code == aiohttp.WSCloseCode.UNSUPPORTED_DATA, text
            # what the page does send works, a size too large for any screen included
            async with session.ws_connect(ws_url(served)) as ws:
                await ws.send_str('["resize", {"width": 100000, "height": 100000}]')
                await ws.send_str('["ping", "42"]')
                await drawn(ws, "pong")
                await ws.send_str('["stdin", "j"]')
                await drawn(ws, "STATUS")
        closed = "flowrun: serve: closed a session that sent a malformed message"
        await asyncio.to_thread(
            poll, lambda: served.text().count(closed) == len(MALFORMED), 60, what="lines"
        )
        await asyncio.to_thread(poll, lambda: not served.consoles(), 90, what="consoles gone")
    assert "Traceback" not in served.text(), served.text()


async def test_a_session_whose_console_ended_is_closed_and_frees_its_place(fr: Flowrun) -> None:
    with serving(fr, "--max-sessions", "1") as served:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(ws_url(served)) as ws:
                await drawn(ws, "STATUS")
                (console,) = served.consoles()
                os.kill(console, signal.SIGKILL)
                await closed_by_server(ws)  # the browser sees the end: no dead tab held
                assert ws.close_code == aiohttp.WSCloseCode.GOING_AWAY
            async with session.ws_connect(ws_url(served)) as ws:  # its place is free
                await drawn(ws, "STATUS")
        assert "closed a session whose console ended" in served.text()
        assert "Traceback" not in served.text()


def test_a_short_token_is_refused(fr: Flowrun) -> None:
    res = fr("serve", "--token", "abc", "--port", "1")
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "flowrun: serve: the token (--token or FLOWRUN_SERVE_TOKEN) has 3 characters; "
        "give at least 16, or none to have one generated"
    )


def test_without_a_token_one_is_generated_and_printed(fr: Flowrun) -> None:
    with serving(fr, token=None) as server:
        token = printed_token(server)
        assert len(token) >= 16
        assert status(f"{server.base}/") == 401
        assert status(f"{server.base}/?token={token}") == 200


def test_off_loopback_plain_http_is_warned(fr: Flowrun) -> None:
    with serving(fr, "--host", "0.0.0.0", token=None) as server:
        assert "plain HTTP off loopback" in server.text()
        assert status(f"{server.base}/?token={printed_token(server)}") == 200


def test_a_port_in_use_is_one_line(fr: Flowrun) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = fr("serve", "--port", str(port))
    assert res.returncode == 2
    # no URL printed for a server that never listened
    assert res.stderr.startswith(f"flowrun: serve: cannot listen on 127.0.0.1:{port}: ")
    assert len(res.stderr.strip().splitlines()) == 1


def _one_free_descriptor(pid: int) -> int:
    """A descriptor limit for ``pid`` under which exactly one more can be opened."""
    used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
    free = [fd for fd in range(max(used) + 3) if fd not in used]
    return free[1]


async def test_a_console_that_cannot_start_closes_its_session_in_one_line(fr: Flowrun) -> None:
    with serving(fr) as served:
        pid = served.proc.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        # room for the browser's connection, none for the console's pipes: a real EMFILE
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (_one_free_descriptor(pid), hard))
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(ws_url(served)) as ws:
                await closed_by_server(ws)
                assert ws.close_code == aiohttp.WSCloseCode.INTERNAL_ERROR
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
            async with session.ws_connect(ws_url(served)) as ws:  # the server goes on
                await drawn(ws, "STATUS")
        line = "flowrun: serve: closed a session that could not start its console: "
        assert line + "Too many open files" in served.text(), served.text()
        assert "Traceback" not in served.text(), served.text()


async def test_out_of_descriptors_at_accept_is_one_line(fr: Flowrun) -> None:
    with serving(fr) as served:
        pid = served.proc.pid
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
        none_free = min(fd for fd in range(max(used) + 2) if fd not in used)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (none_free, hard))
        try:
            with socket.create_connection(("127.0.0.1", served.port)):
                line = "flowrun: serve: socket.accept() out of system resource: Too many open files"
                await asyncio.to_thread(poll, lambda: line in served.text(), 30, what="its line")
                await asyncio.sleep(2.5)  # asyncio retries every second: no line more
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(ws_url(served)) as ws:  # the server goes on
                await drawn(ws, "STATUS")
        assert served.text().count("out of system resource") == 1, served.text()
        assert "Traceback" not in served.text(), served.text()
