"""The one WARNING line that tells an operator what went wrong with an instance.

At the default log level the daemon says, in one line each, when an instance failed,
spent its error budget or its restarts, was killed, lost an attempt, missed a deadline,
or when an alert's delivery gave up: ``"instance 42 (flow f, state s): <text>"``, with
the fields ``instance``, ``flow``, ``state`` and ``kind`` (JSON keys under
``--log-format json``, ``runner.service.logs``). Every such line is made here, so its
shape is the same whoever writes it (the worker's cycle, the recovery of lost attempts,
the deadlines, the deliveries).

``kind`` is the lifecycle kind (``failed``, ``budget_spent``, ``restarts_spent``,
``killed``, ``lost``, ``deadline_missed``) or ``fenced_out``, ``delivery_failed``.
"""

from __future__ import annotations

import logging
from typing import Any


def warn(
    log: logging.Logger,
    instance: int | None,
    flow: str | None,
    state: str | None,
    kind: str,
    text: str,
    **fields: Any,
) -> None:
    """Log ``text`` about ``instance`` of ``flow`` in ``state`` at WARNING on ``log``,
    with the fields ``instance``, ``flow``, ``state``, ``kind`` and ``fields`` (names of
    ``runner.service.logs.FIELDS``)."""
    log.warning(
        "instance %s (flow %s, state %s): %s",
        instance,
        flow,
        state,
        text,
        extra={"instance": instance, "flow": flow, "state": state, "kind": kind, **fields},
    )
