"""The audit's listing may be older than its catalog read: ``zbak archive`` running beside it
writes a stream's objects first and its catalog row last, so a stream catalogued after the
listing was made shows no volumes there. A volume error marks its stream bad, so the audit
asks the store (one ``stat``) before it keeps one. Real ``file://`` store."""

from __future__ import annotations

from zrepl_py.audit.findings import Finding, Severity
from zrepl_py.audit.job import _drop_stale_volume_findings
from zrepl_py.catalog.rows import VolumeRow
from zrepl_py.objects.layout import volume_key
from zrepl_py.stores.file import FileBackend

PREFIX = "zbak/local/tank/a/s-1/"


def error(key: str) -> Finding:
    return Finding(Severity.ERROR, "objects", f"{key} is missing", "check", stream=1, key=key)


def test_a_volume_the_listing_missed_but_the_store_has_as_catalogued_is_no_error(tmp_path):
    backend = FileBackend("cold", tmp_path)
    present, short, absent = (volume_key(PREFIX, i) for i in range(3))
    backend.put(present, [b"x" * 10])
    backend.put(short, [b"x" * 4])
    volumes = {1: [VolumeRow(i + 1, 1, i, key, 20, 10, "0" * 64)
                   for i, key in enumerate((present, short, absent))]}
    manifest = error(PREFIX + "manifest.json")
    findings = [error(present), error(short), error(absent), manifest]

    kept = _drop_stale_volume_findings(backend, findings, volumes)

    assert [f.key for f in kept] == [short, absent, manifest.key]
