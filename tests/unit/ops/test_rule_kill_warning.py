"""A kill a rule makes (in the daemon, through ``runner.ops.commands``) is one WARNING line
naming the instance, its flow and state, kind ``killed``; an operator's kill from the CLI
is not logged (the operator sees the command's own answer). Real SQLite file."""

from __future__ import annotations

import logging

from runner.ops import commands
from tests.support.fault import flow_world, new_instance

FLOW = """\
initial: wait
states:
  wait: {external: true, on: {ok: done}}
  done: {terminal: true}
"""


def test_a_rule_kill_is_one_warning(tmp_path, caplog) -> None:
    engine, flow = flow_world(tmp_path, "k", FLOW)
    by_rule, by_hand = new_instance(engine, flow), new_instance(engine, flow)
    with caplog.at_level(logging.WARNING, logger="flowrun.rules"):
        commands.submit(engine, [by_rule], "kill", source="rule:k#1")
        commands.submit(engine, [by_hand], "kill", source="cli")
    [record] = caplog.records
    assert record.getMessage() == f"instance {by_rule} (flow k, state wait): killed by rule:k#1"
    fields = (record.instance, record.flow, record.state, record.kind)  # type: ignore[attr-defined]
    assert fields == (by_rule, "k", "wait", "killed")
