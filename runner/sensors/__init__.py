"""Sensors and rules: files, log tails and clocks emit events; rules act on them.

The hub (:mod:`runner.sensors.hub`) is what a daemon runs; :mod:`runner.sensors.events`
is the read side (``flowrun events``, ``--exit-when-idle``).
"""
