"""Detected Capabilities kept in the state directory: one probe per run instead of ~7 per pool.

``detect`` asks 6-7 questions per (host, pool), ~0.45 s per replication run over ssh
(benchmarks/replication.py). Its answer changes only when the software or the pool changes,
so ``cached_capabilities`` keeps it in ``<state_dir>/capabilities/<key>.json`` and, on the
next run, asks one cheap question (``capabilities.fingerprint``: ``zpool get all POOL``) and
reuses the answer only when everything still matches:

- the entry is readable JSON of this ``FORMAT`` for the same host label, pool, and zfs/zpool
  commands (the file name is a digest of those, the content is checked as well);
- it is younger than ``ttl`` (default 24 h) and not from the future (a clock stepped back);
- its fingerprint equals the one just read from the host (pool guid, version, features);
- every Capabilities field is present with the right type.

Anything else (missing, corrupt, stale, other pool, unreadable) means ``detect`` again and a
new entry; a cache that cannot be written is only logged. Entries are written to a temporary
file and renamed, so concurrent runs never read half an entry; files are 0600 in a 0700
directory.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from zrepl_py.proc.executor import Executor
from zrepl_py.runtime.statedir import ensure_private_dir
from zrepl_py.zfs.capabilities import Capabilities, detect, fingerprint

log = logging.getLogger(__name__)

FORMAT = 1
"""Version of the entry layout; another value is ignored (detected again)."""
DEFAULT_TTL = dt.timedelta(hours=24)
"""How long an entry is trusted even when its fingerprint still matches (software updates
that add no pool feature are not visible in the fingerprint)."""


def entry_path(cache_dir: Path, host: str, pool: str, zfs: str, zpool: str) -> Path:
    """Return the cache file for one (host label, pool, zfs command, zpool command)."""
    key = json.dumps([host, pool, zfs, zpool])
    return cache_dir / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def encode_entry(
    caps: Capabilities, *, host: str, pool: str, zfs: str, zpool: str, fingerprint: str,
    detected_at: dt.datetime,
) -> str:
    """Return the JSON text of one cache entry (pure).

    Args:
        detected_at: aware UTC instant of the detection.
    """
    return json.dumps({
        "format": FORMAT,
        "host": host,
        "pool": pool,
        "zfs": zfs,
        "zpool": zpool,
        "fingerprint": fingerprint,
        "detected_at": detected_at.timestamp(),
        "capabilities": caps.to_json(),
    }, indent=1, sort_keys=True)  # fmt: skip


def decode_entry(
    text: str, *, host: str, pool: str, zfs: str, zpool: str, fingerprint: str,
    now: dt.datetime, ttl: dt.timedelta = DEFAULT_TTL,
) -> tuple[Capabilities | None, str]:
    """Return the cached Capabilities if the entry may be trusted, and why or why not (pure).

    Args:
        text: the file's content.
        host, pool, zfs, zpool: what the caller is asking about.
        fingerprint: ``capabilities.fingerprint`` read from the host just now.
        now: aware UTC.
        ttl: the longest an entry is trusted.

    Returns:
        ``(caps, "fresh")`` or ``(None, reason)``, reason e.g. ``"expired"``, ``"corrupt: ..."``.
    """
    try:
        entry = json.loads(text)
    except ValueError as exc:
        return None, f"corrupt: {exc}"
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None, "another format"
    if [entry.get(k) for k in ("host", "pool", "zfs", "zpool")] != [host, pool, zfs, zpool]:
        return None, "another host, pool or command"
    if entry.get("fingerprint") != fingerprint:
        return None, "the pool or its software changed"
    stamp = entry.get("detected_at")
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
        return None, "corrupt: no detected_at"
    age = now.timestamp() - stamp
    if age < 0:
        return None, "detected in the future (clock stepped back)"
    if age > ttl.total_seconds():
        return None, "expired"
    found = entry.get("capabilities")
    if not isinstance(found, dict):
        return None, "corrupt: no capabilities"
    try:
        return Capabilities.from_json(found), "fresh"
    except (TypeError, ValueError) as exc:
        return None, f"corrupt: {exc}"


def cached_capabilities(
    executor: Executor,
    pool: str,
    *,
    cache_dir: Path,
    now: dt.datetime,
    zfs: str = "zfs",
    zpool: str = "zpool",
    ttl: dt.timedelta = DEFAULT_TTL,
    timeout: float | None = None,
) -> Capabilities:
    """Return ``pool``'s Capabilities on ``executor``'s host: cached when still valid, else
    detected (and cached). See the module doc for when an entry is trusted.

    Args:
        executor: runs the probes (``executor.host`` is part of the key).
        pool: an imported pool on that host.
        cache_dir: ``<state_dir>/capabilities`` (created 0700 when first written).
        now: aware UTC (the Context's clock).
        zfs, zpool: the commands on that host.
        ttl: how long an entry is trusted.
        timeout: seconds each command may take.

    Raises:
        what ``capabilities.detect`` raises (the fingerprint alone never raises for a failed
        command: a pool that cannot be read is left to ``detect`` to report).
    """
    current = fingerprint(executor, pool, zpool=zpool, timeout=timeout)
    key = dict(host=executor.host, pool=pool, zfs=zfs, zpool=zpool)
    path = entry_path(cache_dir, **key)
    if current is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            reason = "not cached"
        except (OSError, UnicodeDecodeError) as exc:
            reason = f"unreadable: {exc}"
        else:
            caps, reason = decode_entry(text, fingerprint=current, now=now, ttl=ttl, **key)
            if caps is not None:
                return caps
        log.debug("capabilities of %s:%s: %s, detecting", executor.host, pool, reason)
    caps = detect(executor, pool, zfs=zfs, zpool=zpool, timeout=timeout)
    if current is not None:
        _write(path, encode_entry(caps, fingerprint=current, detected_at=now, **key))
    return caps


def _write(path: Path, text: str) -> None:
    try:
        ensure_private_dir(path.parent)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
    except OSError as exc:
        log.warning("cannot cache capabilities in %s: %s", path.parent, exc)
