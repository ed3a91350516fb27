"""flowrun: declarative YAML flows, persisted instances, a worker, sensors, a console.

The public API, for handler authors, is one module, :mod:`runner.control` (its
``__all__``; the contract: ``docs/handlers.md``):

- ``exec`` handlers talk to flowrun through ``keepalive()``, ``checkpoint(dict)``,
  ``goto(state)``, ``sleep(time)`` and ``data()``, or ``python -m runner.control ...``
  from a shell; outside flowrun every call is a no-op.
- ``call`` handlers receive a ``Context`` (``ctx.data``, ``ctx.instance_id``,
  ``ctx.flow``, ``ctx.state``, ``ctx.attempt``, ``ctx.keepalive()``,
  ``ctx.checkpoint(dict)``, ``ctx.cancelled``, ``ctx.sleep_until(when)``);
  ``ctx.checkpoint`` raises ``LeaseLost`` once the instance was taken away; they may
  return a ``Sleep``.
- Exit codes of an ``exec`` handler: 0 → the state's ``next`` (or the state sent with
  ``goto``); 75 (``EX_TEMPFAIL``, ``EXIT_NOT_YET``) → not yet; anything else, or death
  by a signal → error.

Everything else is internal and moves freely. The packages are layers, each importing
only those below it (checked by ``tests/unit/test_layers.py``): the ground modules
(``errors``, ``durations``, ``templating``, ``lifecycle``, ``control_channel``, ...) <
``flowspec`` < ``store`` < ``handlers`` < ``engine``, ``ops`` < ``sensors`` < ``tui`` <
``service`` < ``cli``, and ``control`` above them all (imported by no module of
``runner``); ``docs/architecture.md`` draws the map.

This file imports nothing, and nothing re-exports but ``runner.control``: import every
other name from the module that defines it.
"""
