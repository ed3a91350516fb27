"""Sensors and rules: files, log tails and clocks emit events; rules act on them.

``SensorHub`` (see :mod:`runner.sensors.hub`) is what a daemon runs; ``list_events`` and
``pending_events`` are the read side (``flowrun events``, ``--exit-when-idle``).
"""

from .events import list_events, pending_events
from .hub import SensorHub
from .rules import RuleEngine

__all__ = ["RuleEngine", "SensorHub", "list_events", "pending_events"]
