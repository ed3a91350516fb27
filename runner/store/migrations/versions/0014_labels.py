"""Routing by label: ``workers.labels`` (a daemon's labels), ``instances.runs_on`` (its
state's requirement, resolved) and ``instances.route_event`` (the starting event's fields
the flow's ``runs_on`` templates name), with a partial index on ``(runs_on, due_at)``
(only the instances with a requirement: ``runner.store.routing`` reads them).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | None = None
depends_on: str | None = None

_ROUTED = sa.text("runs_on IS NOT NULL")


def upgrade() -> None:
    """Add the columns and the partial index."""
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("labels", sa.Text(), nullable=True))
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("runs_on", sa.String(length=1000), nullable=True))
        batch.add_column(sa.Column("route_event", sa.Text(), nullable=True))
    op.create_index(
        "ix_instances_runs_on",
        "instances",
        ["runs_on", "due_at"],
        sqlite_where=_ROUTED,
        postgresql_where=_ROUTED,
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_index("ix_instances_runs_on", table_name="instances")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("route_event")
        batch.drop_column("runs_on")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("labels")
