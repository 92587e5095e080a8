"""Streams remember what the store's listing said of their manifest when an audit last read it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25

``zbak audit`` reads every stream's ``manifest.json`` and compares it with the catalog; at
100,000 streams that is 100,000 reads per audit
(docs/decisions.md#audit-trusts-a-manifest-whose-listing-has-not-changed). ``manifest_seen`` keeps
the listing's identity of the manifest (its size and the store's etag: S3's ETag and
LastModified, a file's inode, mtime and ctime) from the last read that agreed with the row,
``manifest_read_at`` when; the next audit re-reads only a manifest whose identity changed
(or whose read is old, ``zrepl_py.audit.objects``). Rows written before this revision have
both NULL: their manifests are read by the next audit. Types are written out, as in 0001.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add streams.manifest_seen and streams.manifest_read_at (nullable, no table rebuild)."""
    op.add_column("streams", sa.Column("manifest_seen", sa.String(1024), nullable=True))
    op.add_column("streams", sa.Column("manifest_read_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Drop the two columns, in place: a batch rebuild of ``streams`` would drop the table
    its volumes reference (SQLite has ``ALTER TABLE ... DROP COLUMN`` since 3.35)."""
    op.drop_column("streams", "manifest_read_at")
    op.drop_column("streams", "manifest_seen")
