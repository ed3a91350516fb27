"""One attempt of a state's handler: ``exec`` (an argv in its own process group) or ``call``
(a Python function), under its timeout and keepalive. No database: checkpoints go through a
callback and the result is a plain :class:`runner.handlers.attempt.AttemptResult`."""
