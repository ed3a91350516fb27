"""The names of flow limits (``runner.store.flow_limits``): ``flow:<flow>[:<key>]``, as
rows of ``pools`` and values of ``waiting_for``. No SQLAlchemy: the read side (``show``,
``explain``, ``pool ls``) names them without loading the store's tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runner.templating import render

PREFIX = "flow:"
"""The names of flow limits in ``pools`` (pool names cannot hold ``:``)."""

NAME_MAX = 200  # the width of ``instances.limit_key`` and ``pools.name``


def is_limit(name: str) -> bool:
    """Whether ``name`` (a ``pools`` row or a ``waiting_for``) is a flow limit."""
    return name.startswith(PREFIX)


def limit_name(flow: str, key: str | None, data: Mapping[str, Any]) -> str:
    """The limit's name for an instance of ``flow`` with ``data``: ``flow:<flow>``, or with
    a ``key`` template ``flow:<flow>:<rendered key>`` (a placeholder naming a missing data
    key renders empty), cut to 200 characters."""
    if key is None:
        return f"{PREFIX}{flow}"
    try:
        value = render(key, {"data": dict(data)})
    except (KeyError, ValueError):
        value = ""
    return f"{PREFIX}{flow}:{value}"[:NAME_MAX]


def describe(name: str) -> str:
    """``max_running of flow nightly`` / ``max_running of flow f (key acme)``."""
    flow, sep, key = name[len(PREFIX) :].partition(":")
    return f"max_running of flow {flow}" + (f" (key {key})" if sep else "")
