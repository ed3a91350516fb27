"""Workers record their process's identity: ``workers.boot_id`` and ``workers.pid_started``.

With the host and pid already recorded, the kernel's boot id (and pid namespace) and the
process's start time (clock ticks since boot) tell a worker on the same host whether
another is provably dead (``runner.store.host``): its leases are then taken over at once
instead of when they expire. Nullable: a row written before this revision proves
nothing and is judged by its heartbeat and leases, as before.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable ``workers.boot_id`` and ``workers.pid_started`` columns."""
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("boot_id", sa.String(length=120), nullable=True))
        batch.add_column(sa.Column("pid_started", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Drop ``workers.boot_id`` and ``workers.pid_started``."""
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("pid_started")
        batch.drop_column("boot_id")
