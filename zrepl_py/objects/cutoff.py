"""A store as it stood at a time: what ``zbak catalog rebuild --not-after TIME`` reads
(docs/security.md#recovery-after-an-intrusion).

An intruder holding the master's keys can write convincing manifests, a forged newer chain
and new catalog exports; on a store that keeps versions (S3 Object Lock) he cannot remove or
change what was written before. So a recovery reads, per key, the newest version whose
LastModified (the server's clock, not the writer's) is no later than TIME, as S3 would have
answered a read at TIME: a key whose newest entry by then is a delete marker, or that had
none, is absent. Every version and delete marker written later is untrusted: ignored, and
listed for the admin.

Pure: :func:`as_of` applies the rule to a version listing (``Backend.list_versions``);
:func:`written_after` is what a store without versions can offer (its listing shows only
the newest objects, so TIME can be honoured only when nothing is newer).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable

from zrepl_py.stores.base import ObjectInfo, Version


@dataclasses.dataclass
class AsOf:
    """The store at ``not_after`` (aware UTC).

    Attributes:
        listing: key -> the version read at ``not_after`` as a listing shows it.
        versions: key -> that version's id (for ``stores.base.get_recorded``).
        untrusted: versions and delete markers written after ``not_after``, in listing
            order (key order, a key's newest first).
    """

    not_after: dt.datetime
    listing: dict[str, ObjectInfo] = dataclasses.field(default_factory=dict)
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    untrusted: list[Version] = dataclasses.field(default_factory=list)


def as_of(versions: Iterable[Version], not_after: dt.datetime) -> AsOf:
    """The store as it stood at ``not_after`` (module docstring; pure).

    Args:
        versions: every version and delete marker, a key's newest first
            (``Backend.list_versions``'s order, S3 ListObjectVersions').
        not_after: aware UTC; a version written at exactly this time is trusted.
    """
    view = AsOf(not_after)
    decided: set[str] = set()
    for version in versions:
        key = version.info.key
        if version.info.modified > not_after:
            view.untrusted.append(version)
        elif key not in decided:
            decided.add(key)
            if not version.marker:
                view.listing[key] = version.info
                view.versions[key] = version.version_id
    return view


def written_after(listing: Iterable[ObjectInfo], not_after: dt.datetime) -> list[ObjectInfo]:
    """The objects of a listing written after ``not_after`` (aware UTC; pure)."""
    return [info for info in listing if info.modified > not_after]
