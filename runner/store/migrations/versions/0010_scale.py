"""Big tables: ``ix_instances_flow_status`` also orders by id, ``(flow, status, id)``.

The pruner reads the deletable instances of one flow and status page by page in id order
(``WHERE flow = ? AND status = ? AND id > ? ORDER BY id LIMIT n``). On PostgreSQL the
entries of ``(flow, status)`` are not in id order, so each page read every instance of
that flow and status and sorted them: 127 ms a page with 95,000 completed instances, a
prune of N instances O(N²). With ``id`` in the index each page is an ordered range scan.
On SQLite the old index already ended with the rowid (this rebuilds it, same order).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 13:30:00
"""

from __future__ import annotations

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Rebuild ``ix_instances_flow_status`` on ``(flow, status, id)``."""
    op.drop_index("ix_instances_flow_status", table_name="instances")
    op.create_index("ix_instances_flow_status", "instances", ["flow", "status", "id"])


def downgrade() -> None:
    """Back to ``(flow, status)``."""
    op.drop_index("ix_instances_flow_status", table_name="instances")
    op.create_index("ix_instances_flow_status", "instances", ["flow", "status"])
