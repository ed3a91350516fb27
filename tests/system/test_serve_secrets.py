"""``flowrun serve`` keeps its secrets out of sight and can speak TLS: a real server, real
console processes read through /proc, the real PostgreSQL server with a password in its
URL, and a certificate made by the ``openssl`` command.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.support.fault import Flowrun, write_flow
from tests.support.serving import FLOW, TOKEN, serving, status

pytestmark = pytest.mark.timeout(300)


async def test_the_database_url_is_on_no_command_line(tmp_path: Path, pg_url: str) -> None:
    # trust authentication accepts any password: the URL carries one as a real one would
    secret = "s3cret-in-the-url"
    url = pg_url.replace("postgres@", f"postgres:{secret}@", 1)
    fr = Flowrun(tmp_path)
    fr.db = url
    write_flow(fr.flows, "web", FLOW)
    assert fr("start", "web").returncode == 0
    # the pooler options given as flags reach the consoles through their environment too
    with serving(fr, options=("--db-pooler", "none", "--listen-db", url)) as server:
        ws_url = server.base.replace("http", "ws", 1) + f"/ws?token={TOKEN}"
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(ws_url) as ws:
                out = b""
                while b"web" not in out or b"STATUS" not in out:  # the console read the db
                    msg = await ws.receive(timeout=90)
                    assert msg.type == aiohttp.WSMsgType.BINARY, msg
                    out += msg.data
                consoles = server.consoles()
                assert consoles
                for pid in consoles:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes()
                    assert secret.encode() not in argv
                    assert b"--db" not in argv.split(b"\0")
                    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    assert f"FLOWRUN_DB={url}".encode() in environ
                    assert f"FLOWRUN_LISTEN_DB={url}".encode() in environ
                    assert b"FLOWRUN_DB_POOLER=none" in environ
                    assert not any(e.startswith(b"FLOWRUN_SERVE_TOKEN=") for e in environ)


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM files)."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_tls_with_certfile_and_keyfile(
    tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "web", FLOW)
    trust = ssl.create_default_context(cafile=str(cert))
    args = ("--certfile", str(cert), "--keyfile", str(key))
    with serving(fr, *args, scheme="https") as server:
        assert "on https://127.0.0.1:" in server.text()
        assert status(f"{server.base}/", trust) == 401
        assert status(server.base.replace("https", "http", 1) + "/") == 0  # no plain HTTP
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{server.base}/?token={TOKEN}", ssl=trust) as page:
                assert page.status == 200
                assert "Secure" in page.headers["Set-Cookie"]
                assert f'"wss://127.0.0.1:{server.port}/ws"' in await page.text()
            ws_url = server.base.replace("https", "wss", 1) + f"/ws?token={TOKEN}"
            async with session.ws_connect(ws_url, ssl=trust) as ws:
                msg = await ws.receive(timeout=90)
                assert msg.type == aiohttp.WSMsgType.BINARY, msg


def test_tls_files_that_do_not_load_are_one_line(tmp_path: Path) -> None:
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "web", FLOW)
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    res = fr("serve", "--certfile", str(tmp_path / "bad.pem"), "--port", "1")
    assert res.returncode == 2
    assert res.stderr.startswith(f"flowrun: serve: cannot load {tmp_path / 'bad.pem'}")
    assert len(res.stderr.strip().splitlines()) == 1
    res = fr("serve", "--keyfile", str(tmp_path / "bad.pem"), "--port", "1")
    assert (res.returncode, res.stderr.strip()) == (2, "flowrun: serve: --keyfile needs --certfile")
