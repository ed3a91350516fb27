"""Attempts keyed by (instance, attempt): a unique constraint replaces the old index.

Commit 66ea5de ("attempts keyed by (instance, attempt)") made the worker address attempt
rows by ``(instance_id, attempt)``; the constraint both serves those lookups and makes a
doubled attempt number impossible. On SQLite the table is rebuilt (batch mode).

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02 00:00:00
"""

from __future__ import annotations

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Replace ``ix_attempts_instance`` by ``uq_attempts_instance_attempt``."""
    with op.batch_alter_table("attempts") as batch:
        batch.drop_index("ix_attempts_instance")
        batch.create_unique_constraint("uq_attempts_instance_attempt", ["instance_id", "attempt"])


def downgrade() -> None:
    """Back to the plain ``(instance_id, id)`` index."""
    with op.batch_alter_table("attempts") as batch:
        batch.drop_constraint("uq_attempts_instance_attempt", type_="unique")
        batch.create_index("ix_attempts_instance", ["instance_id", "id"])
