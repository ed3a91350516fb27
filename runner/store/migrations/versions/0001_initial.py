"""Initial schema: the tables of the first flowrun (before migrations existed).

This is the schema ``metadata.create_all`` produced up to commit 083da5a: attempts were
indexed by ``(instance_id, id)``. A database created then (no ``alembic_version`` table)
is recognised by ``runner.store.migrate`` and stamped at this revision, then upgraded.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

#: JSON on SQLite, JSONB on PostgreSQL (frozen here: a migration never imports the models).
JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    """Create every table and index of the initial schema."""
    op.create_table(
        "instances",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("flow", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=200), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("data", JSONType, nullable=False),
        sa.Column("due_at", sa.Float(), nullable=True),
        sa.Column("locked_by", sa.String(length=200), nullable=True),
        sa.Column("locked_until", sa.Float(), nullable=True),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("state_errors", JSONType, nullable=False),
        sa.Column("state_restarts", sa.Integer(), nullable=False),
        sa.Column("running_attempt", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("state_changed", sa.Float(), nullable=False),
        sa.Column("state_attempted", sa.Float(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("event_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_instances_claim", "instances", ["status", "due_at"])
    op.create_index("ix_instances_flow_status", "instances", ["flow", "status"])
    op.create_index("ix_instances_locked_by", "instances", ["locked_by"])

    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=200), nullable=False),
        sa.Column("worker", sa.String(length=200), nullable=False),
        sa.Column("fence", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=200), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("checkpoint", JSONType, nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_attempts_instance", "attempts", ["instance_id", "id"])

    op.create_table(
        "commands",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.Integer(), nullable=False),
        sa.Column("command", sa.String(length=16), nullable=False),
        sa.Column("args", JSONType, nullable=False),
        sa.Column("source", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_commands_instance", "commands", ["instance_id"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sensor", sa.String(length=400), nullable=False),
        sa.Column("key", sa.String(length=1000), nullable=False),
        sa.Column("payload", JSONType, nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("handled_at", sa.Float(), nullable=True),
        sa.Column("action", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sensor", "key", name="uq_events_sensor_key"),
    )
    op.create_index("ix_events_pending", "events", ["handled_at", "id"])

    op.create_table(
        "sensors",
        sa.Column("name", sa.String(length=400), nullable=False),
        sa.Column("cursor", JSONType, nullable=False),
        sa.Column("locked_by", sa.String(length=200), nullable=True),
        sa.Column("locked_until", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )

    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("stopped_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )

    op.create_table(
        "flow_versions",
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("flow", sa.String(length=200), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("loaded_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("version"),
    )


def downgrade() -> None:
    """Drop every table of the initial schema."""
    for table in (
        "flow_versions",
        "workers",
        "sensors",
        "events",
        "commands",
        "attempts",
        "instances",
    ):
        op.drop_table(table)
