"""``exec`` handlers: the whole process tree ends with its attempt, output is drained with a
bounded tail, large data goes through a file.

Real subprocesses (``sh``, ``setsid``, ``head``, the test interpreter); this test process is
made a child subreaper for the tests that need it (``reaper.start``/``stop``), as a worker
is. Deaths are read from ``/proc``; every wait polls with a generous deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.handlers import data, reaper
from runner.handlers.attempt import Cancel, Limits
from tests.support.fault import pid_alive, poll
from tests.unit.handlers.test_executor import run

#: every test here on both spawn paths (the C extension and Python: ``spawn_path``)
pytestmark = pytest.mark.usefixtures("spawn_path")

PY_READ_DATA = (
    "import json, os\n"
    "path = os.environ.get('FLOWRUN_DATA_FILE')\n"
    "data = json.load(open(path)) if path else json.loads(os.environ['FLOWRUN_DATA'])\n"
    "json.dump({'inline': 'FLOWRUN_DATA' in os.environ, 'file': path,\n"
    "           'size': len(data['blob']), 'n': data['n']}, open('seen.json', 'w'))\n"
)


@pytest.fixture
def subreaper() -> Iterator[None]:
    """This process as a worker makes it: a child subreaper whose reaper thread runs."""
    reaper.start()
    try:
        yield
    finally:
        reaper.stop()


def _gone_and_reaped(pid: int) -> bool:
    """True once ``pid`` is dead and no longer a zombie (reaped, or never ours)."""
    return not pid_alive(pid) and not os.path.exists(f"/proc/{pid}")


ESCAPES = (
    # leaves the group and the session, parent still the handler
    "setsid sleep 1000 & echo $! > escaped; "
    # a double fork: re-parented to us at once, in the handler's group
    "(sleep 1000 & echo $! > orphan) ; "
    # a double fork that also leaves the session
    "(setsid sleep 1000 & echo $! > orphan_setsid) ; "
)
ESCAPED = ("escaped", "orphan", "orphan_setsid")


def _escaped_pids(folder: Path) -> list[int]:
    return _written_pids(folder, ESCAPED)


def _written_pids(folder: Path, names: tuple[str, ...]) -> list[int]:
    """The pids in these files, once each is written (it exists before ``echo`` writes)."""

    def written(name: str) -> bool:
        path = folder / name
        return path.exists() and path.read_text().endswith("\n")

    poll(lambda: all(written(n) for n in names), 30, 0.02)
    return [int((folder / n).read_text()) for n in names]


async def _all_ended(pids: list[int]) -> None:
    await asyncio.to_thread(
        poll, lambda: all(_gone_and_reaped(p) for p in pids), 30, 0.05, "escapees ended"
    )


async def test_escaped_descendants_end_with_a_clean_exit(tmp_path: Path, subreaper) -> None:
    res = await run(["sh", "-c", ESCAPES + "exit 0"], tmp_path)
    assert res.outcome == "moved", res.error
    pids = _escaped_pids(tmp_path)
    await _all_ended(pids)


async def test_escaped_descendants_end_with_a_timeout(tmp_path: Path, subreaper) -> None:
    res = await run(["sh", "-c", ESCAPES + "sleep 1000"], tmp_path, limits=Limits(1.0, None, 1.0))
    assert res.outcome == "timeout"
    await _all_ended(_escaped_pids(tmp_path))


async def test_escaped_descendants_end_with_a_kill(tmp_path: Path, subreaper) -> None:
    cancel = Cancel()
    task = asyncio.ensure_future(run(["sh", "-c", ESCAPES + "sleep 1000"], tmp_path, cancel=cancel))
    pids = await asyncio.to_thread(_escaped_pids, tmp_path)
    cancel.set("killed by operator")
    res = await asyncio.wait_for(task, 30)
    assert res.outcome == "cancelled"
    await _all_ended(pids)


async def test_escapee_of_a_running_attempt_is_left_alone(tmp_path: Path, subreaper) -> None:
    """A double-forked child is ours at once, but its attempt still runs: not ended."""
    cancel = Cancel()
    script = "(sleep 1000 & echo $! > orphan); sleep 1000"
    task = asyncio.ensure_future(run(["sh", "-c", script], tmp_path, cancel=cancel))
    [orphan] = await asyncio.to_thread(_written_pids, tmp_path, ("orphan",))
    await asyncio.sleep(10 * reaper.EVERY)  # several sweeps
    assert pid_alive(orphan), "ended while its attempt was still running"
    cancel.set("done")
    await asyncio.wait_for(task, 30)
    await _all_ended([orphan])


def test_a_dead_daemons_handlers_are_ended(tmp_path: Path) -> None:
    """A process whose token names a daemon that no longer runs is ended by the next start
    (``reaper.end_orphans``); one naming a live daemon is not."""
    dead = f"{2**22 + 7}.1.1"  # above pid_max: no such daemon
    live = f"{os.getpid()}.0.1"  # this process, but a wrong start time: also dead
    mine = reaper.new_token()  # this process, right start time: alive
    procs = {}
    for name, token in (("dead", dead), ("stale", live), ("mine", mine)):
        env = {**os.environ, reaper.TOKEN_ENV: token}
        procs[name] = _sleeper(env)
    try:
        # not ``>= 2``: any flowrun daemon starting on this host meanwhile (another
        # test's) may end them first; that they end is what holds whoever does it
        reaper.end_orphans()
        for name in ("dead", "stale"):
            assert procs[name].wait(30) == -9
        assert procs["mine"].poll() is None
    finally:
        reaper.ended(mine)
        for p in procs.values():
            p.kill()
            p.wait(30)


def _sleeper(env: dict) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "1000"], env=env)


# -- output: drained as it comes, bounded tail ----------------------------------------------


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_200_mb_of_stdout_and_stderr_complete_in_bounded_memory(tmp_path: Path) -> None:
    mb = 200_000_000
    script = f"head -c {mb} /dev/zero & head -c {mb} /dev/zero >&2; wait; echo THE END >&2; exit 3"
    peak = [_rss_kb()]
    before = peak[0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], _rss_kb())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        res = await run(["sh", "-c", script], tmp_path, limits=Limits(600, None, 2.0))
    finally:
        done.set()
        sampler.join()
    assert res.outcome == "error" and res.error.startswith("exit code 3: ")
    assert res.error.endswith("THE END")
    grown_mb = (peak[0] - before) / 1024
    assert grown_mb < 50, f"RSS grew by {grown_mb:.0f} MB while draining 400 MB"


# -- large data -----------------------------------------------------------------------------


async def test_small_data_is_inline(tmp_path: Path) -> None:
    res = await run(["python", "-c", PY_READ_DATA], tmp_path, data={"blob": "x" * 100, "n": 1})
    assert res.outcome == "moved", res.error
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {"inline": True, "file": None, "size": 100, "n": 1}


async def test_16_mb_of_data_reaches_the_handler_through_a_file(tmp_path: Path) -> None:
    blob = "y" * (16 * 1024 * 1024)
    res = await run(["python", "-c", PY_READ_DATA], tmp_path, data={"blob": blob, "n": 2})
    assert res.outcome == "moved", res.error
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert (seen["inline"], seen["size"], seen["n"]) == (False, len(blob), 2)
    assert not os.path.exists(seen["file"]), "the data file outlived its attempt"


def test_data_file_is_private_and_the_threshold_holds() -> None:
    env, path = data.data_env({"a": "z" * data.DATA_INLINE_MAX})
    try:
        assert set(env) == {data.DATA_FILE_ENV} and path is not None
        assert os.stat(path).st_mode & 0o077 == 0, "readable by others"
        assert json.loads(Path(path).read_text()) == {"a": "z" * data.DATA_INLINE_MAX}
    finally:
        data.remove_data_file(path)
    env, path = data.data_env({"a": 1})
    assert (env, path) == ({data.DATA_ENV: '{"a":1}'}, None)


@pytest.mark.parametrize("size", [10, 1024 * 1024])
async def test_control_data_reads_inline_or_file(tmp_path: Path, size: int) -> None:
    script = "from runner.control import data; open('n', 'w').write(str(len(data()['blob'])))"
    res = await run(["python", "-c", script], tmp_path, data={"blob": "b" * size})
    assert res.outcome == "moved", res.error
    assert (tmp_path / "n").read_text() == str(size)
