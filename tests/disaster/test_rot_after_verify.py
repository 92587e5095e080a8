"""docs/decisions.md#the-releasing-chain-is-rechecked-before-any-delete, prune: a full that rots
after its verification must not let prune delete the last restorable chain, and a ``verified`` mark
that has aged releases nothing.

On a real pool through the CLI: the old chain (full @0, incrementals to @9) and a new full @10
verified by ``zbak audit --deep``; then one byte of a volume of @10 flips in the store
(``file://``, or moto's S3 where the object is re-uploaded changed). ``zbak prune --dry-run``
says the old chain goes once @10 is re-checked; ``zbak prune`` re-checks, finds the flip,
deletes nothing, marks @10 ``bad``, exits 1 and alerts through a webhook; @9 still restores
from the old chain.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from disaster.conftest import MIB, content_of, restored_content, snapshots

from zrepl_py.catalog.db import make_engine
from zrepl_py.catalog.repository import Catalog
from zrepl_py.config.loading import load_config
from zrepl_py.errors import ExitStatus

pytestmark = pytest.mark.zfs


def write_config(site, store_toml: str, hook_url: str) -> None:
    site.write(f"""
        [stores.cold]
        {store_toml}
        volume_size = "1MiB"
        [jobs.data]
        dataset = "{site.data}"
        [jobs.data.archive]
        store = "cold"
        keep_chains = 1
        [alerts.webhook]
        url = "{hook_url}"
    """)


def catalog_of(site) -> Catalog:
    return Catalog(make_engine(load_config(site.config).catalog_url))


def streams(site) -> list[dict]:
    """``zbak list streams --json``."""
    return json.loads(site.ok("list", "streams", "--json"))


def two_chains(site) -> None:
    """Archive @0..@9 (full @0 + incrementals), verify, then a new full @10, verified too."""
    site.ok("init", "--no-checks")
    site.snapshot_steps(range(10), 1 * MIB)
    site.ok("archive")
    site.ok("audit", "--deep")
    site.snapshot_steps(range(10, 11), 1 * MIB)
    site.ok("archive", "--full")
    site.ok("audit", "--deep")
    fulls = {s["to_name"]: s for s in streams(site) if s["kind"] == "full"}
    assert set(fulls) == {"0", "10"} and fulls["10"]["state"] == "verified"


def full_volume(site, name: str) -> tuple[int, str]:
    """(stream id, key of its middle volume) of the full ending at @NAME."""
    catalog = catalog_of(site)
    (full,) = [s for s in catalog.streams(dataset=site.data)
               if s.kind == "full" and s.to_name == name]
    volumes = catalog.volumes(full.id)
    assert len(volumes) >= 2, "the full spans several volumes"
    return full.id, volumes[len(volumes) // 2].key


def flip(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1:]


def rot_is_caught(site, webhook, rot) -> None:
    """The shared scenario: ``rot(key)`` flips one byte of @10's volume ``key`` in the store."""
    two_chains(site)
    bad_id, key = full_volume(site, "10")
    objects = len(catalog_of(site).volumes(bad_id)) + 1  # the volumes and the manifest
    rot(key)
    before = {s["id"]: s["state"] for s in streams(site)}

    status, out, err = site.run("prune", "--dry-run")
    assert status == ExitStatus.OK, out + err
    assert (f"will re-check {objects} objects of the releasing chain @10 (stream {bad_id})"
            " before deleting") in out
    plan = json.loads(site.ok("prune", "--dry-run", "--json"))
    rows = {r["stream"]: r for r in plan["streams"]}
    assert rows["full @0"]["action"] == "delete" and rows["full @0"]["released_by"] == bad_id
    assert rows["full @0"]["reasons"] == [
        "beyond keep_chains = 1 (chain 2 from the newest)",
        f"released by the verified chain @10 (stream {bad_id}), re-checked against the catalog"
        " before the first delete"]
    assert rows["full @0"]["recheck"].startswith(f"will re-check {objects} objects")

    status, out, err = site.run("prune", "--json")
    assert status == ExitStatus.FAILED, out + err
    plan = json.loads(out)
    (check,) = plan["archive"]["data"]["datasets"][site.data]["rechecks"]
    assert check["stream_id"] == bad_id and check["result"] == "mismatch"
    assert check["bad_streams"] == [bad_id] and check["mismatches"][0]["key"] == key
    assert plan["archive"]["data"]["datasets"][site.data]["deleted"] == []
    rows = {r["stream"]: r for r in plan["streams"]}
    assert rows["full @0"]["action"] == "delete stopped"
    assert f"mismatch in stream {bad_id}" in rows["full @0"]["recheck"]
    assert rows["full @10"]["state"] == "bad"
    assert "run zbak prune again" not in err
    assert f"mismatch in stream {bad_id}" in err and "nothing deleted" in err
    rows_after = {s["id"]: s for s in streams(site)}
    after = {i: s["state"] for i, s in rows_after.items()}
    assert set(after) == set(before), "no stream was deleted"
    assert after[bad_id] == "bad"
    assert rows_after[bad_id]["bad_reason"].startswith(f"{key}: "), rows_after[bad_id]
    assert "(found by zbak prune at " in rows_after[bad_id]["bad_reason"]
    assert all(state == "verified" for i, state in after.items() if i != bad_id)
    failures = [b for b in webhook.bodies if b["kind"] == "failure" and b["action"] == "prune"]
    assert failures and f"mismatch in stream {bad_id}" in failures[0]["message"], webhook.bodies

    # the next prune keeps the old chain, saying why: the newer full is bad
    status, out, err = site.run("prune", "--json")
    rows = {r["stream"]: r for r in json.loads(out)["streams"]}
    assert rows["full @0"]["action"] == "keep"
    assert rows["full @0"]["reasons"][0].startswith("bad: the newer full @10"), rows["full @0"]
    assert f"is marked bad ({key}: " in rows["full @0"]["reasons"][0], rows["full @0"]

    into = f"{site.pool}/restored"
    site.ok("restore", site.data, "--to", "@9", "--into", into, "--from", "cold", "--yes")
    assert snapshots(into)[-1] == "9"
    assert restored_content(into) == content_of(f"{site.data}@9", site.pool, "rot")


def test_a_file_store_full_that_rots_after_verify_is_caught_before_prune_deletes_the_old_chain(
        site, webhook):
    store = site.tmp / "store"
    store.mkdir()
    write_config(site, f'url = "file://{store}"', webhook.url)

    def rot(key: str) -> None:
        path = store / key
        path.write_bytes(flip(path.read_bytes()))

    rot_is_caught(site, webhook, rot)


@pytest.mark.s3
def test_an_s3_full_that_rots_after_verify_is_caught_before_prune_deletes_the_old_chain(
        site, webhook, s3_server, s3_bucket):
    write_config(site, f'url = "s3://{s3_bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"\n'
                 f'region = "{s3_server.region}"', webhook.url)
    client = s3_server.client()

    def rot(key: str) -> None:
        # A plain PutObject of the changed bytes: moto may keep or drop the stored checksum;
        # either the HEAD checksum or the re-read (STANDARD class) must see the flip.
        full = f"zbak/{key}"
        body = client.get_object(Bucket=s3_bucket, Key=full)["Body"].read()
        client.put_object(Bucket=s3_bucket, Key=full, Body=flip(body))

    rot_is_caught(site, webhook, rot)


def test_a_verified_mark_older_than_reverify_after_releases_nothing_until_audit_renews_it(
        site, webhook):
    store = site.tmp / "store"
    store.mkdir()
    write_config(site, f'url = "file://{store}"', webhook.url)
    site.ok("init", "--no-checks")
    site.snapshot_steps(range(3), 1 * MIB)
    site.ok("archive")
    site.snapshot_steps(range(3, 4), 1 * MIB)
    site.ok("archive", "--full")
    site.ok("audit", "--deep")
    catalog = catalog_of(site)
    (new,) = [s for s in catalog.streams(dataset=site.data) if s.to_name == "3"]
    # verified 31 days ago: past the default reverify_after of 30 days
    catalog.set_stream_state(new.id, "verified",
                             dt.datetime.now(dt.UTC) - dt.timedelta(days=31))

    plan = json.loads(site.ok("prune", "--json"))
    rows = {r["stream"]: r for r in plan["streams"]}
    assert rows["full @0"]["action"] == "keep"
    assert "longer than reverify_after 30d" in rows["full @0"]["reasons"][0]
    assert "zbak audit --deep re-verifies it" in rows["full @0"]["reasons"][0]
    assert len(streams(site)) == 3

    site.ok("audit", "--deep")
    plan = json.loads(site.ok("prune", "--json"))
    (check,) = plan["archive"]["data"]["datasets"][site.data]["rechecks"]
    assert check["stream_id"] == new.id and check["result"] == "ok" and check["reread"] >= 2
    assert [s["to_name"] for s in streams(site)] == ["3"]
