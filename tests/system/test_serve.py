"""``flowrun serve``: the console in a real headless Chromium (selenium), a real
``flowrun serve`` process and a real SQLite file.

The page draws the terminal on a canvas, so the test reads what the console sends: a
script injected before the page loads records the websocket's frames (the terminal
output), in which the instances table's header and rows appear. Keys go to xterm's input
element; the pause is read back from the database. Skips, saying why, when Chromium,
its driver or selenium is missing (``.ci/run`` installs Debian's ``chromium`` and
``chromium-driver``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fault import Flowrun, engine_at, poll, row, write_flow
from tests.support.serving import FLOW, TOKEN, serving, status

pytestmark = pytest.mark.timeout(300)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
DOCS = Path(__file__).resolve().parents[2] / "docs"

#: Records every websocket frame the page receives in ``window.__out``.
HOOK = r"""
window.__out = "";
const Native = window.WebSocket;
window.WebSocket = function (url, protocols) {
  const ws = protocols === undefined ? new Native(url) : new Native(url, protocols);
  ws.addEventListener("message", (ev) => {
    const d = ev.data;
    if (typeof d === "string") { window.__out += d; }
    else if (d instanceof ArrayBuffer) { window.__out += new TextDecoder().decode(d); }
    else if (d && d.arrayBuffer) {
      d.arrayBuffer().then((b) => { window.__out += new TextDecoder().decode(b); });
    }
  });
  return ws;
};
window.WebSocket.prototype = Native.prototype;
Object.assign(window.WebSocket, { CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3 });
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Flowrun, str]]:
    """Two instances of a flow that waits for an event, and `flowrun serve` (its sessions'
    consoles attach: no worker)."""
    fr = Flowrun(tmp_path)
    write_flow(fr.flows, "web", FLOW)
    for _ in range(2):
        assert fr("start", "web").returncode == 0
    with serving(fr) as server:
        yield fr, server.base


def test_requests_without_the_token_are_refused(served) -> None:
    _, base = served
    assert status(base + "/") == 401
    assert status(base + "/ws") == 401
    assert status(base + "/?token=wrong") == 401
    assert status(f"{base}/?token={TOKEN}") == 200


@pytest.mark.skipif(CHROMIUM is None or DRIVER is None, reason="no chromium/chromedriver")
def test_the_console_in_a_real_browser(served) -> None:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    fr, base = served
    db = engine_at(fr.home)
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,800")
    browser = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOOK})
        browser.get(f"{base}/?token={TOKEN}")

        def drawn() -> bool:
            out = browser.execute_script("return window.__out || ''")
            return all(word in out for word in ("STATUS", "STATE", "instances", "web"))

        poll(drawn, 120, every=0.5, what="the instances table in the page")
        if os.environ.get("FLOWRUN_SCREENSHOT"):
            browser.save_screenshot(str(DOCS / "console-in-browser.png"))
        keys = browser.find_element("css selector", ".xterm-helper-textarea")
        keys.send_keys("p")  # pause the instance under the cursor: the first row
        poll(lambda: row(db, 1)["status"] == "paused", 60, what="paused from the browser")
        assert row(db, 2)["status"] == "runnable"
        commands = fr.show(1)["commands"]
        assert [(c["command"], c["source"]) for c in commands] == [("pause", "tui")]
    finally:
        browser.quit()
