"""What ``explain`` says of an instance waiting for a worker with its labels
(``runner.ops.forecast.route_wait``): queued behind live matching workers, or none alive
since a time, with the move its ``routing_timeout`` makes. Pure: times passed in."""

from __future__ import annotations

from types import SimpleNamespace

from runner.labels import NO_ROUTING, Routing
from runner.ops.explanation import clock
from runner.ops.forecast import route_wait

T0 = 2_000_000_000.0


def _inst(alive: int, last: float | None) -> dict:
    route = {"alive": alive, "last": last}
    return {"runs_on": '{"gpu":"1"}', "due_at": T0, "route_now": route}


def test_queued_behind_live_workers() -> None:
    text = route_wait(_inst(2, None), SimpleNamespace(routing=NO_ROUTING), T0 + 5)
    assert text.startswith("waiting for a worker with gpu=1: 2 alive (queued")


def test_none_alive_since_and_the_timeouts_move() -> None:
    st = SimpleNamespace(routing=Routing({"gpu": "1"}, 600.0, "cpu_path"))
    text = route_wait(_inst(0, T0 + 60), st, T0 + 120)
    assert f"waiting for a worker with gpu=1: none alive since {clock(T0 + 60)}" in text
    assert f"routing_timeout moves it to cpu_path at {clock(T0 + 660)}" in text
    never = route_wait(_inst(0, None), SimpleNamespace(routing=NO_ROUTING), T0)
    assert never == "waiting for a worker with gpu=1: none ever seen"
