"""flowrun: declarative YAML flows, persisted instances, a worker, sensors, a console.

The public API, for handler authors (the contract: ``docs/handlers.md``):

- ``exec`` handlers talk to flowrun through :mod:`runner.control` (``keepalive()``,
  ``checkpoint(dict)``, ``goto(state)``, or ``python -m runner.control ...`` from a
  shell); outside flowrun every call is a no-op.
- ``call`` handlers receive a :class:`runner.handlers.attempt.Context` (``ctx.data``,
  ``ctx.instance_id``, ``ctx.flow``, ``ctx.state``, ``ctx.attempt``, ``ctx.keepalive()``,
  ``ctx.checkpoint(dict)``, ``ctx.cancelled``); ``ctx.checkpoint`` raises
  :class:`runner.handlers.attempt.LeaseLost` once the instance was taken away.
- Exit codes of an ``exec`` handler: 0 → the state's ``next`` (or the state sent with
  ``goto``); 75 (``EX_TEMPFAIL``, :data:`runner.handlers.attempt.EXIT_NOT_YET`) → not yet;
  anything else, or death by a signal → error.

Everything else is internal and moves freely. The packages are layers, each importing
only those below it (checked by ``tests/unit/test_layers.py``): the ground modules
(``errors``, ``durations``, ``templating``, ``lifecycle``, ``control``) < ``flowspec`` <
``store`` < ``handlers`` < ``engine``, ``ops`` < ``sensors`` < ``tui`` < ``service`` <
``cli``; ``docs/architecture.md`` draws the map.

This file imports nothing, and no package re-exports: import every name from the module
that defines it.
"""
