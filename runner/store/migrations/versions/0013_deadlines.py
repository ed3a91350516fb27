"""Deadlines: ``instances.deadline_at`` (the earliest deadline of the instance not yet
acted on: ``runner.store.deadlines``) with a partial index on it (only the instances of
flows with deadlines; a daemon reads its smallest value to sleep until then).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | None = None
depends_on: str | None = None

_SET = sa.text("deadline_at IS NOT NULL")


def upgrade() -> None:
    """Add the column and its partial index."""
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("deadline_at", sa.Float(), nullable=True))
    op.create_index(
        "ix_instances_deadline",
        "instances",
        ["deadline_at"],
        sqlite_where=_SET,
        postgresql_where=_SET,
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_index("ix_instances_deadline", table_name="instances")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("deadline_at")
