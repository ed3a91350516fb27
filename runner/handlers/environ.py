"""A handler's environment, encoded for ``execve`` once for all the handlers that share it.

Every ``exec`` handler gets the daemon's environment (less its credentials, or only a few
variables with ``env_inherit: none``) plus a few ``FLOWRUN_*`` variables
(:func:`handler_env`, ``runner.handlers.spawn``). Encoding all
of it to ``b"key=value"`` items per spawn would be a fifth of a spawn thread's Python time
(``docs/performance.md``, "The environment encoded once"); an :class:`Env` keeps the shared part
apart, so that only the handler's own variables are encoded per spawn.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any

#: ``id(base) -> (base, [b"key=value", ...])`` for the bases of :class:`Env` objects
_encoded: dict[int, tuple[dict[str, Any], list[bytes]]] = {}
_FS_ENCODING = sys.getfilesystemencoding()


class Env(dict[str, str]):
    """A handler's environment: ``base`` plus ``added`` (a plain ``dict`` to read).

    ``base`` (a dict that never changes afterwards: the daemon's environment) is encoded
    once for every handler started with it; only the keys added (``added``, :meth:`add`,
    ``env[key] = value``, ``update``) are encoded per spawn. Any other change (``del``,
    ``pop``, ...) makes the whole environment encoded per spawn, as a plain dict's.
    """

    __slots__ = ("base", "added")

    def __init__(self, base: dict[str, str], added: dict[str, str]) -> None:
        dict.__init__(self, base)
        dict.update(self, added)
        self.base: dict[str, str] | None = base
        self.added = dict(added)

    def add(self, values: dict[str, str]) -> None:
        """Set every key of ``values``."""
        dict.update(self, values)
        self.added.update(values)

    def __setitem__(self, key: str, value: str) -> None:
        self.add({key: value})

    def update(self, *args, **kwargs) -> None:
        self.add(dict(*args, **kwargs))

    def __delitem__(self, key: str) -> None:
        self.base = None
        super().__delitem__(key)

    def pop(self, *args):
        self.base = None
        return super().pop(*args)

    def popitem(self):
        self.base = None
        return super().popitem()

    def setdefault(self, *args):
        self.base = None
        return super().setdefault(*args)

    def clear(self) -> None:
        self.base = None
        super().clear()

    def __ior__(self, other):  # type: ignore[misc]
        self.base = None
        return super().__ior__(other)


def encode_env(env: dict[str, str]) -> list[bytes]:
    """``env`` as ``b"key=value"`` items; an :class:`Env`'s base is encoded once.
    Raises ``ValueError`` for a key with ``=``."""
    items, added = encode_parts(env)
    return [*items, *(_encode_item(key, value) for key, value in added.items())]


def encode_parts(env: dict[str, str]) -> tuple[list[bytes], dict[str, str]]:
    """``(items, added)``: ``env`` as ``b"key=value"`` items encoded once (an
    :class:`Env`'s base, less the keys set again) plus the variables still to encode (its
    added ones; all of a plain dict's). The list may be the cache's own: never change it.
    For ``runner.handlers._spawn``, which encodes ``added`` itself. Raises ``ValueError``
    for a base key with ``=``."""
    base = getattr(env, "base", None)
    if base is None:
        return [], env
    cached = _encoded_base(base)
    added: dict[str, str] = env.added  # type: ignore[attr-defined]
    if added.keys().isdisjoint(base):
        return cached, added
    return [item for key, item in zip(base, cached, strict=True) if key not in added], added


def _encoded_base(base: dict[str, str]) -> list[bytes]:
    """``base``'s items encoded, once for each base dict (a never-changed one)."""
    cached = _encoded.get(id(base))
    if cached is None or cached[0] is not base:
        cached = (base, [_encode_item(key, value) for key, value in base.items()])
        if len(_encoded) >= 64:
            _encoded.clear()
        _encoded[id(base)] = cached
    return cached[1]


def add_env(env: dict[str, str], values: dict[str, str]) -> None:
    """Set every key of ``values`` in ``env`` (an :class:`Env` or a plain dict)."""
    if type(env) is Env:
        env.add(values)
    else:
        env.update(values)


def _encode_item(key: str, value: str) -> bytes:
    if "=" in key:
        raise ValueError("illegal environment variable name")
    return (key + "=" + value).encode(_FS_ENCODING, "surrogateescape")


#: Variables of the daemon's environment that carry its credentials (the database URLs of
#: ``--db`` and ``--listen-db``, the console's token, libpq's password): never a handler's
#: (a handler that needs one gets it as a secret: ``secrets: {FLOWRUN_DB: {env: FLOWRUN_DB}}``).
CREDENTIAL_VARS = ("FLOWRUN_DB", "FLOWRUN_LISTEN_DB", "FLOWRUN_SERVE_TOKEN", "PGPASSWORD")

#: What ``env_inherit: none`` keeps of the daemon's environment.
MINIMAL_VARS = ("PATH", "HOME", "LANG", "TZ")


def handler_env(
    flow: str,
    state: str,
    instance_id: int,
    attempt: int,
    cwd: Path,
    inherit: str = "daemon",
    strip: tuple[str, ...] = (),
) -> Env:
    """The environment of an ``exec`` handler: the base (``inherit``: ``"daemon"``, ours
    less ``CREDENTIAL_VARS`` and ``strip``; ``"none"``, only ``MINIMAL_VARS`` of ours)
    plus ``FLOWRUN_*`` and ``PYTHONPATH`` (the data, control and reaper variables are
    added when it starts: ``spawn.spawn``)."""
    added = {
        "FLOWRUN_INSTANCE": str(instance_id),
        "FLOWRUN_FLOW": flow,
        "FLOWRUN_STATE": state,
        "FLOWRUN_ATTEMPT": str(attempt),
    }
    return Env(_base_env(cwd, inherit, strip), added)


@functools.lru_cache(maxsize=64)
def _base_env(cwd: Path, inherit: str = "daemon", strip: tuple[str, ...] = ()) -> dict[str, str]:
    """Our environment (as of the first handler started in ``cwd``; less the credentials,
    or only the minimal variables) with ``PYTHONPATH`` extended by ``cwd`` and flowrun's
    own folder (so ``python -m runner.control`` works).
    Worked out once (and encoded once: ``environ.Env``): copying ``os.environ`` and
    resolving paths cost more per attempt than the rest of starting it; never changed."""
    if inherit == "none":
        env = {k: os.environ[k] for k in MINIMAL_VARS if k in os.environ}
    else:
        env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARS and k not in strip}
    extra = [str(cwd), str(Path(__file__).resolve().parents[2])]
    if env.get("PYTHONPATH"):
        extra.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(extra)
    return env
