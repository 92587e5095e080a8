"""Each volume's stored version and its lock: ``volumes.version_id``, ``volumes.retain_until``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28

On a versioned S3 bucket every upload makes a version of its key, and on a store with
``[stores.NAME.object_lock]`` zbak locks that version until a retain-until date
(docs/design.md#object-lock). The catalog records both per volume, as the upload learnt them:
the version is what zbak wrote (a later version or a delete marker is someone else's), and the
date tells when the lock must be extended or lapses without asking the store. Both nullable:
a ``file://`` or ``sftp://`` store and an unversioned bucket have no versions, and rows
catalogued before this revision or from a manifest (``catalog rebuild``, a stream adopted
after a crash) do not know them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from zrepl_py.catalog.types import UtcDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the two nullable columns (no table rebuild)."""
    op.add_column("volumes", sa.Column("version_id", sa.String(1024), nullable=True))
    op.add_column("volumes", sa.Column("retain_until", UtcDateTime(), nullable=True))


def downgrade() -> None:
    """Drop them in place (a batch rebuild of ``volumes`` is not needed: nothing references
    the columns); the volumes stay."""
    op.drop_column("volumes", "retain_until")
    op.drop_column("volumes", "version_id")
