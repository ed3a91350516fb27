"""Alembic migrations of the flowrun schema (run by :func:`runner.store.migrate.upgrade`).

``env.py`` and ``versions/`` are loaded by alembic from this folder at run time; they ship
as package data. To add a revision during development::

    .venv/bin/python -c "from alembic import command; from runner.store.migrate import \\
        alembic_config; command.revision(alembic_config(), 'what changed')"

then write its ``upgrade`` and ``downgrade`` by hand (explicit operations, never
autogenerate at run time), add a fingerprint to ``runner.store.migrate.LEGACY_FINGERPRINTS``
only if create_all-made databases of that schema can exist, and keep
``tests/test_migrations.py`` green: the migrations must produce exactly the schema of
``runner/models.py`` on SQLite and PostgreSQL.
"""
