"""Flow limits: ``instances.limit_key`` (the ``max_running`` limit, and key, of the
instance's flow: ``runner.store.flow_limits``) with a partial index on ``(limit_key,
locked_by)`` (only the instances of flows with a limit; the running ones are found by a
range of it).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | None = None
depends_on: str | None = None

_LIMITED = sa.text("limit_key IS NOT NULL")


def upgrade() -> None:
    """Add the column and its partial index."""
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("limit_key", sa.String(length=200), nullable=True))
    op.create_index(
        "ix_instances_limit",
        "instances",
        ["limit_key", "locked_by"],
        sqlite_where=_LIMITED,
        postgresql_where=_LIMITED,
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_index("ix_instances_limit", table_name="instances")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("limit_key")
