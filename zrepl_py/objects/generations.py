"""Generations of a catalog export on a store that keeps versions
(docs/decisions.md#write-once-catalog-exports).

There each export is written once, under its own key ``_zbak/catalog/NODE/JOB/GNNNNNNNNNN.json``
(``objects.layout.generation_key``) and its ``.copy``; the single key
``_zbak/catalog/NODE/JOB.json`` is what other stores rewrite in place (and what a lock store
held before). The rules here are pure: which number the next generation takes, which
generation a reader takes, and which versions of older generations ``zbak prune`` may delete.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable

from zrepl_py.objects.layout import parse_export_key
from zrepl_py.stores.base import Version


def next_generation(keys: Iterable[str], floor: int) -> int:
    """The number of the next generation: one more than every generation key in ``keys``
    (a version listing's keys, delete markers included, so no key is ever written twice)
    and than ``floor`` (the mark's generation, the single key's)."""
    used = [floor]
    for key in keys:
        parsed = parse_export_key(key)
        if parsed is not None and parsed[2] is not None:
            used.append(parsed[2])
    return max(used) + 1


@dataclasses.dataclass
class Candidates:
    """The export keys of one ``NODE/JOB`` in a listing: the single key when present, and
    the generation keys, newest first (a reader tries them in that order)."""

    single: str | None = None
    generations: list[str] = dataclasses.field(default_factory=list)


def candidates(keys: Iterable[str]) -> dict[str, Candidates]:
    """Single key -> its :class:`Candidates` among ``keys`` (primaries and copies alike;
    other keys ignored)."""
    found: dict[str, Candidates] = {}
    numbered: dict[str, dict[str, int]] = {}
    for key in keys:
        parsed = parse_export_key(key)
        if parsed is None:
            continue
        single, _, generation = parsed
        entry = found.setdefault(single, Candidates())
        if generation is None:
            entry.single = single
        else:
            numbered.setdefault(single, {})[key.removesuffix(".copy")] = generation
    for single, keyed in numbered.items():
        found[single].generations = sorted(keyed, key=keyed.__getitem__, reverse=True)
    return found


def stale_versions(versions: Iterable[Version], keep: Collection[str]) -> list[Version]:
    """The versions and delete markers of one export's older generations, which prune
    deletes once their locks lapse: every key under it but the newest generation's and the
    keys in ``keep`` (the generation this machine's mark trusts, primary and copy). The
    single key counts as older than any generation key.

    Args:
        versions: a version listing of the export's keys (its single key and
            ``NODE/JOB/`` directory).
        keep: keys never deleted.
    """
    listed = [(v, parse_export_key(v.info.key)) for v in versions]
    newest = max((p[2] for _, p in listed if p is not None and p[2] is not None), default=None)
    if newest is None:
        return []
    return [v for v, parsed in listed if parsed is not None and parsed[2] != newest
            and v.info.key not in keep]


def job_generations(versions: Iterable[Version], job: str) -> list[Version]:
    """The versions of the generation keys of ``job``'s exports, every machine's (what
    ``zbak audit`` checks for tampering; single keys are rewritten by design)."""
    return [v for v in versions if (parsed := parse_export_key(v.info.key)) is not None
            and parsed[1] == job and parsed[2] is not None]
