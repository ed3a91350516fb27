"""Retention: ``instances.history_from`` and an index of the instances events started.

``history_from`` (nullable float, epoch seconds) is set when the pruner cut the old
attempts of a live instance: its history before that time is gone (``flowrun show`` and
``explain`` say so). ``ix_instances_event`` (partial: ``event_id IS NOT NULL``) lets the
pruner ask whether an event still has an instance it started, and ``flowrun events``
whether the instance an event's action names is still there.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None

_HAS_EVENT = sa.text("event_id IS NOT NULL")


def upgrade() -> None:
    """Add ``instances.history_from`` and the partial index ``ix_instances_event``."""
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("history_from", sa.Float(), nullable=True))
    op.create_index(
        "ix_instances_event",
        "instances",
        ["event_id"],
        sqlite_where=_HAS_EVENT,
        postgresql_where=_HAS_EVENT,
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_index("ix_instances_event", table_name="instances")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("history_from")
