"""The handler authors' API: every name a handler imports from flowrun, in one module.

``exec`` handlers (a program; their side of the control channel, no-ops outside
flowrun)::

    from runner.control import checkpoint, data, goto, keepalive, sleep
    rows_done = data().get("rows_done", 0)    # the instance data, however large
    checkpoint({"rows_done": 1000})           # stored durably; also a keepalive
    goto("quarantine")        # or: sleep("15m") / sleep("2026-12-01T09:00:00Z")

or from a shell: ``python -m runner.control keepalive | checkpoint JSON | goto STATE |
sleep TIME``. Exit 0 takes the state's ``next`` (or the ``goto``), ``EXIT_NOT_YET`` (75)
means "not yet", anything else is an error.

``call`` handlers (a Python function given a :class:`Context`)::

    from runner.control import Context, LeaseLost, Sleep

    def summarise(ctx: Context) -> str | Sleep | None:
        ctx.checkpoint({"rows_done": 1000})   # raises LeaseLost: let it propagate
        return "archive"

The contract behind these names is ``docs/handlers.md``. This is the one module of
``runner`` that re-exports (``tests/unit/test_layers.py`` allows exactly it): the names
are defined in :mod:`runner.control_channel` (the control channel, a ground module) and
:mod:`runner.handlers.attempt` (the ``call`` side). Nothing in ``runner`` imports this
module. The ``call`` side's names load on first use (PEP 562), so an ``exec`` handler's
``from runner.control import checkpoint`` or ``python -m runner.control`` loads neither
the handlers package nor ``asyncio``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.control_channel import (
    EXIT_NOT_YET,
    checkpoint,
    data,
    goto,
    keepalive,
    main,
    sleep,
)

if TYPE_CHECKING:
    from runner.handlers.attempt import Context, LeaseLost, Sleep

__all__ = (
    # exec handlers: the control channel
    "checkpoint",
    "data",
    "goto",
    "keepalive",
    "sleep",
    "EXIT_NOT_YET",
    # call handlers
    "Context",
    "LeaseLost",
    "Sleep",
)

#: The ``call`` side's names, loaded from ``runner.handlers.attempt`` on first use.
_CALL_SIDE = ("Context", "LeaseLost", "Sleep")


def __getattr__(name: str) -> object:
    """``Context``, ``LeaseLost`` and ``Sleep``, imported when first asked for."""
    if name in _CALL_SIDE:
        from runner.handlers import attempt

        return getattr(attempt, name)
    raise AttributeError(f"module 'runner.control' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_CALL_SIDE})


if __name__ == "__main__":
    raise SystemExit(main())
