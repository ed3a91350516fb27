"""Alerts: the ``deliveries`` table (a rule's ``exec``/``webhook`` owed for an event).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 13:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None

#: JSON on SQLite, JSONB on PostgreSQL (frozen here: a migration never imports the models).
JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    """Create ``deliveries`` and its indexes."""
    op.create_table(
        "deliveries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("event_id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(400), nullable=False),
        sa.Column("target", JSONType, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("due_at", sa.Float(), nullable=True),
        sa.Column("give_up_at", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_result", sa.Text(), nullable=True),
        sa.Column("delivered_at", sa.Float(), nullable=True),
        sa.Column("once_key", sa.String(1000), nullable=True),
        sa.Column("suppressed", sa.Integer(), nullable=False),
        sa.Column("folded_before", sa.Integer(), nullable=False),
        sa.Column("locked_by", sa.String(200), nullable=True),
        sa.Column("locked_until", sa.Float(), nullable=True),
    )
    op.create_index("ix_deliveries_due", "deliveries", ["status", "due_at"])
    op.create_index("ix_deliveries_event", "deliveries", ["event_id"])
    op.create_index("ix_deliveries_once", "deliveries", ["rule", "once_key", "created_at"])


def downgrade() -> None:
    """Drop it."""
    op.drop_table("deliveries")
