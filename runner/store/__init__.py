"""The database: tables, engines and dialect differences, prepared statements, migrations,
WAL checkpoints, and the worker's write side (create, claim, renew, fenced commit), flow
versions and the worker's own heartbeat row. The one door to SQL for the write path."""
