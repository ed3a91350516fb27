"""An ``exec`` notifier for the example's alerts: reads the event (JSON on stdin) and
appends one line to ``alerts.log`` next to this file, e.g.::

    2026-11-27T13:00:00.000Z csv_ingest instance 7 (inbox/x.csv) killed in quarantine: ...
    2026-11-28T13:00:00.000Z csv_ingest instance 8 (inbox/y.csv) deadline_missed in quarantine

A real deployment would mail, page or post to a chat here; any exit but 0 makes flowrun
retry the delivery. ``FLOWRUN_EVENT_ID`` names the event (the same on a retried delivery).
"""

import json
import os
import sys
from pathlib import Path


def main() -> int:
    event = json.load(sys.stdin)
    label = f" ({event['label']})" if event.get("label") else ""
    error = f": {event['error']}" if event.get("error") else ""
    line = (
        f"{event.get('at')} {event.get('flow')} instance {event.get('instance')}{label} "
        f"{event.get('kind')} in {event.get('state')}{error} "
        f"[event {os.environ.get('FLOWRUN_EVENT_ID')}]\n"
    )
    with open(Path(__file__).with_name("alerts.log"), "a", encoding="utf-8") as out:
        out.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
