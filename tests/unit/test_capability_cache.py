"""When a cached capability answer may be trusted (``zfs/capability_cache.py``, pure parts)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from zrepl_py.zfs.capabilities import Capabilities
from zrepl_py.zfs.capability_cache import DEFAULT_TTL, decode_entry, encode_entry, entry_path

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
CAPS = Capabilities(parsable_list=True, resume_tokens=True, bookmarks=True, raw_send=True,
                    compressed_send=True, holds=True, multi_snapshot=True, pool_version=5000,
                    list_holds=True, receive_properties=True,
                    features=(("large_blocks", "enabled"), ("lz4_compress", "active")))  # fmt: skip
KEY = dict(host="backup", pool="tank", zfs="zfs", zpool="zpool")


def entry(**changes) -> dict:
    data = json.loads(encode_entry(CAPS, fingerprint="f1", detected_at=NOW, **KEY))
    data.update(changes)
    return data


def decode(data, *, fingerprint="f1", now=NOW, **key):
    text = data if isinstance(data, str) else json.dumps(data)
    return decode_entry(text, fingerprint=fingerprint, now=now, **{**KEY, **key})


def test_an_entry_reads_back_as_the_same_capabilities_while_fresh():
    assert decode(entry()) == (CAPS, "fresh")
    assert decode(entry(), now=NOW + DEFAULT_TTL)[0] == CAPS


@pytest.mark.parametrize(("case", "data", "asked", "reason"), [
    ("expired", entry(), dict(now=NOW + DEFAULT_TTL + dt.timedelta(seconds=1)), "expired"),
    ("from the future", entry(), dict(now=NOW - dt.timedelta(minutes=1)), "future"),
    ("pool or software changed", entry(), dict(fingerprint="f2"), "changed"),
    ("another pool", entry(), dict(pool="tank2"), "another host"),
    ("another host", entry(), dict(host="backup2"), "another host"),
    ("another zfs command", entry(), dict(zfs="/opt/zfs"), "another host"),
    ("another format", entry(format=2), {}, "another format"),
    ("not json", "{not json", {}, "corrupt"),
    ("truncated", encode_entry(CAPS, fingerprint="f1", detected_at=NOW, **KEY)[:40], {}, "corrupt"),
    ("a list", "[1, 2]", {}, "another format"),
    ("no timestamp", entry(detected_at=None), {}, "corrupt"),
    ("missing field", entry(capabilities={k: v for k, v in CAPS.to_json().items()
                                          if k != "list_holds"}), {}, "corrupt"),
    ("unknown field", entry(capabilities={**CAPS.to_json(), "new": True}), {}, "corrupt"),
    ("string for a flag", entry(capabilities={**CAPS.to_json(), "holds": "yes"}), {}, "corrupt"),
    ("bool for the version", entry(capabilities={**CAPS.to_json(), "pool_version": True}), {},
     "corrupt"),
    ("capabilities not a mapping", entry(capabilities=[1]), {}, "corrupt"),
    ("a feature not a pair", entry(capabilities={**CAPS.to_json(), "features": [["x"]]}), {},
     "corrupt"),
    ("an entry of an older zbak, without pool features",
     entry(capabilities={k: v for k, v in CAPS.to_json().items()
                         if k not in ("features", "receive_properties")}), {}, "corrupt"),
])  # fmt: skip
def test_an_entry_that_does_not_fit_is_never_trusted(case, data, asked, reason):
    caps, why = decode(data, **asked)
    assert caps is None
    assert reason in why


def test_unknown_pool_version_round_trips_as_none():
    unknown = dataclasses.replace(CAPS, pool_version=None)
    text = encode_entry(unknown, fingerprint="f1", detected_at=NOW, **KEY)
    assert decode(text)[0] == unknown


def test_each_host_pool_and_command_has_its_own_file(tmp_path):
    paths = {entry_path(tmp_path, **{**KEY, key: "other"}) for key in KEY}
    assert len(paths | {entry_path(tmp_path, **KEY)}) == len(KEY) + 1
    assert all(path.parent == tmp_path and path.suffix == ".json" for path in paths)
