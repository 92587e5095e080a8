"""``[jobs.NAME.copy.STORE]``: a copy of the job's chains in store STORE (docs/copies.md)."""

from __future__ import annotations

from pydantic import Field

from zrepl_py.config.archive import ChainRetentionConfig
from zrepl_py.stores.settings import StorageClasses
from zrepl_py.values.fields import CronSchedule, Duration, Table


class CopyConfig(Table):
    """``[jobs.NAME.copy.STORE]``: ``zbak copy NAME`` copies the job's streams that store STORE
    lacks from the store ``from``.

    Attributes:
        source: the store copied from, written ``from`` (a field named ``from`` is a Python
            keyword); None: the job's archive store.
        storage_class: the classes the copy's volumes are put in; None: the store's.
        schedule: when ``zbak daemon`` runs ``zbak copy NAME --to STORE`` (crontab, UTC);
            None: the daemon does not copy to STORE.
        retention: the chains ``zbak prune`` keeps in STORE (the archive's keys:
            ``keep_chains``, ``max_age``, ``reverify_after``, ``min_storage_duration``);
            None: every chain copied there is kept, and the store's retention wants every
            chain (docs/copies.md#retention-per-store).
        max_lag: how long a stream may wait in the store copied from before ``zbak status
            --check`` warns that the copy lags (``copying.lag``); None: twice the longest gap
            between two runs of ``schedule``, and without a schedule the lag is shown but not
            judged (docs/copies.md#how-far-a-copy-lags).
    """

    source: str | None = Field(None, alias="from")
    storage_class: StorageClasses | None = None
    schedule: CronSchedule | None = None
    retention: ChainRetentionConfig | None = None
    max_lag: Duration | None = None
