"""Streams marked bad keep why: ``streams.bad_reason``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28

A stream is marked ``bad`` by ``zbak archive`` (a volume missing or of another size in the
store's listing), ``zbak audit`` (the same, and with ``--deep`` a volume of another checksum
or a BEGIN record naming other guids), ``zbak restore`` (zfs receive rejected its content)
and ``zbak prune`` (a releasing chain's object changed). The state alone made every later
refusal guess the cause: a restore said "zfs receive rejected its content" for a volume that
was simply missing. ``bad_reason`` holds the marker's sentence, naming the object's key and
who found it when (``archive.damage.mark_bad``); it is set exactly when the state becomes
``bad``. Rows marked bad before this revision keep NULL: their reason was never recorded
(readers say so). Text, not a bounded string: a reason quotes up to three keys of up to
1,024 bytes each and zfs receive's message.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add streams.bad_reason (nullable, no table rebuild)."""
    op.add_column("streams", sa.Column("bad_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop the column in place (see 0005's downgrade: a batch rebuild of ``streams`` would
    drop the table its volumes reference); the bad streams stay ``bad``."""
    op.drop_column("streams", "bad_reason")
