"""Pools: the ``pools`` table and the instance columns of slots held and waited for.

``pools`` (name, declared, slots, updated_at, rate, starts) holds each pool's size: the
flow files' (``declared``) and the operator's (``slots``, ``flowrun pool set``), and a
rate's latest starts (a state's own rate: a row ``<flow>.<state>``). On ``instances``:
``pool``/``pool_slots`` (the pool and slots the running attempt holds), ``waiting_for``/
``wait_due`` (the pool an instance waits for, not due meanwhile, and the due time it had),
with a partial index each (only the rows that hold or wait).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 00:00:00
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None

_HOLDS = sa.text("pool IS NOT NULL")
_WAITS = sa.text("waiting_for IS NOT NULL")


def _json() -> sa.types.TypeEngine[Any]:
    """JSON, JSONB on PostgreSQL (as ``runner.store.tables.JSONType``)."""
    from sqlalchemy.dialects.postgresql import JSONB

    return sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    """Add the ``pools`` table, the four instance columns and their partial indexes."""
    op.create_table(
        "pools",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("declared", sa.Integer(), nullable=True),
        sa.Column("slots", sa.Integer(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("rate", sa.String(length=40), nullable=True),
        sa.Column("starts", _json(), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("pool", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("pool_slots", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("waiting_for", sa.String(length=200), nullable=True))
        batch.add_column(sa.Column("wait_due", sa.Float(), nullable=True))
    op.create_index(
        "ix_instances_pool", "instances", ["pool"], sqlite_where=_HOLDS, postgresql_where=_HOLDS
    )
    op.create_index(
        "ix_instances_waiting",
        "instances",
        ["waiting_for", "wait_due"],
        sqlite_where=_WAITS,
        postgresql_where=_WAITS,
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_index("ix_instances_waiting", table_name="instances")
    op.drop_index("ix_instances_pool", table_name="instances")
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("wait_due")
        batch.drop_column("waiting_for")
        batch.drop_column("pool_slots")
        batch.drop_column("pool")
    op.drop_table("pools")
