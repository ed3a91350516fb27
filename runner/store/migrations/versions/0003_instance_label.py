"""Instances carry a label: a flow's ``label`` template rendered over the instance's data.

``label: "{data.path}"`` in a flow file names each instance in ``flowrun ls``, ``show`` and
the console (paths shortened, at most 40 characters). Nullable: older instances and flows
without a label have none.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable ``instances.label`` column."""
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("label", sa.String(length=200), nullable=True))


def downgrade() -> None:
    """Drop ``instances.label``."""
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("label")
