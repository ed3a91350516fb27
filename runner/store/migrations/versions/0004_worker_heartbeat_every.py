"""Workers record their own heartbeat interval: ``workers.heartbeat_every`` (seconds).

A worker beats every third of its lease (at most a minute; ``runner.ops.liveness``), no
longer every 2 s, so liveness must judge each worker by its own interval. Nullable: rows
written before this revision are judged by the old fixed 2 s.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable ``workers.heartbeat_every`` column."""
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("heartbeat_every", sa.Float(), nullable=True))


def downgrade() -> None:
    """Drop ``workers.heartbeat_every``."""
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("heartbeat_every")
