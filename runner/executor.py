"""One attempt: run a state's ``exec`` or ``call`` handler under its timeout and keepalive.

The executor knows nothing of the database: checkpoints go through a callback the worker
supplies, and the worker turns the returned :class:`AttemptResult` into an outcome.

- ``exec``: an argv list run without a shell, each argument rendered on its own from
  ``{data.x}``/``{event.x}`` key paths; a new session (process group) so a cancel or a
  timeout terminates the handler and its children (SIGTERM, then SIGKILL after
  ``kill_grace`` seconds). The control channel is described in ``runner.control``.
  Exit 0 → ``goto`` target or ``next``; 75 (``EX_TEMPFAIL``) → not yet; other → error
  with the tail of stderr.
- ``call``: ``module:function``, sync (run in a thread) or async (a task on the loop),
  given a :class:`Context`. Returns a state name (move), ``True`` (take ``next``),
  ``None`` (not yet), or raises (error).

A missed keepalive or the ``timeout`` ends the attempt as ``timeout`` (the worker counts a
restart: majordomo's model); a cancel (pause, kill, lost lease, shutdown) as ``cancelled``.
"""

from .attempt import (
    EXIT_NOT_YET,
    TAIL,
    AttemptResult,
    Cancel,
    CheckpointFn,
    Context,
    LeaseLost,
    Limits,
)
from .call_handler import run_call
from .exec_handler import handler_env, interpreter, live_groups, render_argv, run_exec

__all__ = [
    "EXIT_NOT_YET",
    "TAIL",
    "AttemptResult",
    "Cancel",
    "CheckpointFn",
    "Context",
    "LeaseLost",
    "Limits",
    "handler_env",
    "interpreter",
    "live_groups",
    "render_argv",
    "run_call",
    "run_exec",
]
