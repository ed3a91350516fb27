"""libpq settings every PostgreSQL connection flowrun opens (``runner.store.db``'s engines,
``runner.store.notify``'s listener, ``runner.store.pg_reader``'s CLI reads); a URL's own
win. Kept apart from ``runner.store.db`` so a reader can use them without SQLAlchemy.
"""

from __future__ import annotations

from typing import Any

#: Seconds libpq waits for a connection to be made (``connect_timeout``).
CONNECT_TIMEOUT = 5

#: libpq's TCP settings:
#: a peer that stops answering (a black-holed network drops packets, nothing refuses
#: them) is noticed within seconds instead of the kernel's two hours of keepalive idle
#: and 15 minutes of retransmissions. ``tcp_user_timeout`` (ms): data sent and not
#: acknowledged for that long closes the connection; keepalive probes after 5 s of
#: silence, every second, 3 unanswered end it.
TCP_SETTINGS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,
}
