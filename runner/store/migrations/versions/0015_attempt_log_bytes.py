"""``attempts.log_bytes``: the bytes an attempt's handler wrote to its attempt log (NULL:
not captured). An attempt that wrote nothing stores no end row in ``attempt_logs`` (its
0 here tells a follower it ended: ``runner.store.log_reader.outcome_of``).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the column."""
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("log_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    """Drop it."""
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("log_bytes")
