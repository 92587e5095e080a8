"""``[restore]``: how cold objects are thawed, what thawing costs, where volumes wait, where
an archive chain is received to read its files and where drills restore."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from zrepl_py.errors import InvalidName
from zrepl_py.values.fields import Table
from zrepl_py.zfs.names import DatasetName


class ThawPrice(Table):
    """What retrieving (thawing) cold objects costs at one class and tier, in USD."""

    per_gb: float = Field(ge=0)
    per_1000_requests: float = Field(ge=0)


# AWS S3 pricing, us-east-1, retrieval from S3 Glacier Flexible Retrieval ("GLACIER") and
# S3 Glacier Deep Archive (https://aws.amazon.com/s3/pricing/, "Requests & data retrievals");
# Deep Archive has no Expedited tier. Override under [restore.prices.CLASS.TIER].
DEFAULT_THAW_PRICES: dict[str, dict[str, ThawPrice]] = {
    "GLACIER": {
        "Expedited": ThawPrice(per_gb=0.03, per_1000_requests=10.0),
        "Standard": ThawPrice(per_gb=0.01, per_1000_requests=0.05),
        "Bulk": ThawPrice(per_gb=0.0, per_1000_requests=0.025),
    },
    "DEEP_ARCHIVE": {
        "Standard": ThawPrice(per_gb=0.02, per_1000_requests=0.10),
        "Bulk": ThawPrice(per_gb=0.0025, per_1000_requests=0.025),
    },
}


class RestoreConfig(Table):
    """``[restore]``: how cold objects are thawed and where downloaded volumes wait."""

    thaw_tier: Literal["Expedited", "Standard", "Bulk"] = "Standard"
    thaw_days: int = Field(7, ge=1, le=365)
    """Days a thawed copy stays readable (S3 RestoreObject ``Days``)."""
    spool_dir: Path | None = None
    """Where volumes from remote stores are verified before receive; default STATE_DIR/spool."""
    download_concurrency: int = Field(4, ge=1, le=64)
    prices: dict[str, dict[str, ThawPrice]] = {}
    """Overrides of DEFAULT_THAW_PRICES, per storage class and tier."""
    scratch: str | None = None
    """A dataset on this machine (``POOL/PATH``, it must exist) under which zbak receives an
    archive chain to read files from it, as ``POOL/PATH/zbak-files-<hex>``, destroyed once
    the files are out (``files.scratch``), and where ``zbak drill`` restores what it drills
    from a store, as ``POOL/PATH/zbak-drill-<hex>`` (docs/drills.md#where-a-drill-restores);
    None: neither runs. Everything zbak puts there is its own: a child named ``zbak-files-*``
    no run holds is destroyed by the next file restore (docs/files.md#the-scratch-dataset),
    one named ``zbak-drill-*`` by the next drill."""

    @field_validator("scratch")
    @classmethod
    def _scratch(cls, value: str | None) -> str | None:
        if value is not None:
            if ":" in value.split("/", 1)[0]:
                raise ValueError(f"{value!r}: the scratch dataset is on this machine:"
                                 " POOL/PATH, without a host")
            try:
                DatasetName(value)
            except InvalidName as exc:
                raise ValueError(str(exc)) from None
        return value

    def price(self, storage_class: str, tier: str) -> ThawPrice | None:
        """The price of thawing ``storage_class`` at ``tier`` (None: not a cold class/tier)."""
        found = self.prices.get(storage_class, {}).get(tier)
        return found or DEFAULT_THAW_PRICES.get(storage_class, {}).get(tier)
