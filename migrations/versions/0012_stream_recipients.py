"""The age recipients each sealed stream was encrypted to: ``streams.sealed_to``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30

A chain continues only while any one identity of the store's recipients now opens every
stream of it (docs/sealed.md#changing-the-recipients): ``zbak archive`` starts a new chain
when a recipient was added since a stream of the chain was sealed, or the store is no longer
sealed. This column records each sealed stream's recipients (the public keys, one per line,
sorted, ssh keys without their comment). Nullable: plain streams have none, and sealed
streams catalogued before this revision or from their manifest (which names no key) are
not known; a chain with such a stream continues as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the nullable column (no table rebuild)."""
    op.add_column("streams", sa.Column("sealed_to", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop it in place; the streams stay."""
    op.drop_column("streams", "sealed_to")
