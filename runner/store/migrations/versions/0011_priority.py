"""Priorities: ``instances.priority`` (1..9, default 5) and ``start_priority``, and the
claim's and the pool waiters' indexes ordered by priority.

``priority`` is an instance's effective priority (``flowrun start --priority``, else its
state's, else its flow's); ``start_priority`` the start's (NULL: none). The claim reads
``ix_instances_claim (status, priority DESC, due_at)``, one range of due rows per
priority in index order; a pool's waiters are woken in ``ix_instances_waiting
(waiting_for, priority DESC, wait_due)`` order.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 14:00:00
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the two columns, rebuild the two indexes with ``priority DESC``."""
    with op.batch_alter_table("instances") as batch:
        batch.add_column(
            sa.Column("priority", sa.SmallInteger(), nullable=False, server_default="5")
        )
        batch.add_column(sa.Column("start_priority", sa.SmallInteger(), nullable=True))
    op.drop_index("ix_instances_claim", table_name="instances")
    op.create_index(
        "ix_instances_claim", "instances", ["status", sa.desc(sa.column("priority")), "due_at"]
    )
    op.drop_index("ix_instances_waiting", table_name="instances")
    op.create_index(
        "ix_instances_waiting",
        "instances",
        ["waiting_for", sa.desc(sa.column("priority")), "wait_due"],
        **_waiters(),
    )


def _waiters() -> dict[str, Any]:
    """The partial index's condition (only the instances waiting for a pool)."""
    waits = sa.text("waiting_for IS NOT NULL")
    return {"sqlite_where": waits, "postgresql_where": waits}


def downgrade() -> None:
    """Back to ``(status, due_at)`` and ``(waiting_for, wait_due)``; drop the columns."""
    op.drop_index("ix_instances_waiting", table_name="instances")
    op.create_index(
        "ix_instances_waiting",
        "instances",
        ["waiting_for", "wait_due"],
        **_waiters(),
    )
    op.drop_index("ix_instances_claim", table_name="instances")
    op.create_index("ix_instances_claim", "instances", ["status", "due_at"])
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("start_priority")
        batch.drop_column("priority")
