"""Attempt logs: ``attempt_logs``, what every attempt's handler wrote, in chunks.

One row per chunk (``runner.store.tables.LogChunk``), keyed by instance, attempt and
``seq`` (``ix_attempt_logs_attempt``); deleted with the instance (``runner.store.prune``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``attempt_logs`` and its index."""
    op.create_table(
        "attempt_logs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("stream", sa.SmallInteger(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_attempt_logs_attempt", "attempt_logs", ["instance_id", "attempt", "seq"])


def downgrade() -> None:
    """Drop them."""
    op.drop_index("ix_attempt_logs_attempt", table_name="attempt_logs")
    op.drop_table("attempt_logs")
