"""Each stream's manifest versions and their lock: ``streams.manifest_version_id``,
``streams.manifest_copy_version_id``, ``streams.manifest_retain_until``.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28

On a store with ``[stores.NAME.object_lock]`` the rolling lock extends every object
retention still wants (docs/design.md#immutable-cold-storage); it could extend only the
volumes, whose versions revision 0010 records. These columns record the versions of
``manifest.json`` and ``manifest.json.copy`` the upload made and when their locks lapse (the
earlier of the two: both are locked and extended together), so ``zbak archive`` and ``zbak
audit`` extend them with the volumes. Nullable: other stores keep no versions, and streams
catalogued before this revision or from their manifest do not know them (their manifests
lapse one period after they were written, as before).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from zrepl_py.catalog.types import UtcDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the three nullable columns (no table rebuild)."""
    op.add_column("streams", sa.Column("manifest_version_id", sa.String(1024), nullable=True))
    op.add_column("streams", sa.Column("manifest_copy_version_id", sa.String(1024),
                                       nullable=True))
    op.add_column("streams", sa.Column("manifest_retain_until", UtcDateTime(), nullable=True))


def downgrade() -> None:
    """Drop them in place; the streams stay."""
    op.drop_column("streams", "manifest_retain_until")
    op.drop_column("streams", "manifest_copy_version_id")
    op.drop_column("streams", "manifest_version_id")
