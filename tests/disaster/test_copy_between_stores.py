"""``zbak copy`` between stores (docs/copies.md), run as the admin types it, against the real
stores: a ``file://`` store, moto's S3 server and an SFTP-only server (``support.sftpd``).

* file:// -> S3 -> sftp:// as ``[jobs.NAME.copy.STORE]`` says (the copy's ``from`` and storage
  class): a full and an incremental reach each store byte for byte, each store
  holds exactly what the catalog says of it, a rerun copies nothing, ``zbak audit`` checks
  every store, restore chooses among the copies and says which it read, and restores from the
  copy of a copy; a stream marked bad is never copied.
* A copy to S3 killed with SIGKILL mid-volume of a 64 MiB stream: the rerun keeps the volumes
  that arrived (checked, not sent again), converges, and leaves no orphan in either store (the
  multipart upload the kill left open is aborted).
* Into a store of another codec chain (plain, sealed to one key, sealed to another), each
  volume re-encoded: the same raw send stream in every store, no hash of it in a sealed one,
  an identity asked for a sealed source, the send stream's records checked against the
  snapshots recorded, and a copy killed mid-volume starting the stream again.
* S3 to S3 on one endpoint (docs/copies.md#s3-to-s3-inside-s3), behind ``support.s3proxy`` so
  the test sees every request: volumes uploaded as one PutObject and as a multipart upload are
  copied by CopyObject (no GET of a volume, no volume body sent), into an Object Lock store
  locked as it locks; a CopyObject answering another SHA-256 is refused and deleted; a copy
  killed while S3 copies a volume reruns and converges without reading a volume either.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import blake3
import botocore.exceptions
import pyrage
import pytest
import zstandard
from conftest import MIB, PACED, PACED_VOLUME, content_of, prop, restored_content, zfs
from support.archive_checks import catalog_of, catalogued, converged_problems
from support.cli import faulty_zbak
from support.common import hosts_table
from support.s3proxy import S3Proxy

from zrepl_py.config.loading import load_config
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest
from zrepl_py.stores.registry import open_store
from zrepl_py.stores.scheme import StoreEnv

pytestmark = [pytest.mark.zfs, pytest.mark.slow]
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def problems_in(site, store: str) -> list[str]:
    """``converged_problems`` of store ``store``: it holds exactly the catalog's streams of it
    (volumes with their sizes and SHA-256, manifests and copies, its catalog export)."""
    config = load_config(site.config)
    backend = open_store(store, config.stores[store],
                         StoreEnv(hosts=config.hosts, known_hosts=site.tmp / "state/known_hosts"))
    try:
        with catalog_of(site.config) as catalog:
            streams = [(s, v) for s, v in catalogued(catalog, site.data) if s.store == store]
        assert streams, f"store {store} holds no stream"
        return converged_problems(backend, streams)
    finally:
        backend.close()


def write_config(site, stores: dict[str, str], *, volume: int = MIB, head: str = "",
                 tail: str = "") -> None:
    """A config of ``stores`` (name -> the lines of its table, subtables after them), each
    in ``volume``-byte volumes, and job ``data`` archiving ``site.data`` to the first; ``head`` and ``tail``
    go before and after (TOML)."""
    tables = "".join(f"[stores.{name}]\nvolume_size = {volume}\n{body}\n"
                     for name, body in stores.items())
    site.config.write_text(f'state_dir = "{site.tmp / "state"}"\n{head}{tables}'
                           f'[jobs.data]\ndataset = "{site.data}"\n[jobs.data.archive]\n'
                           f'store = "{next(iter(stores))}"\ncompression_level = 1\n{tail}')


def s3_table(s3_server, bucket: str) -> str:
    """The lines of an S3 store's table on moto's server."""
    return (f'url = "s3://{bucket}/zbak"\nendpoint = "{s3_server.endpoint_url}"\n'
            'region = "us-east-1"')


def copied(site, *args: str) -> list[dict]:
    """``zbak copy ARGS --json``, asserting exit 0; its rows."""
    return json.loads(site.ok("copy", *args, "--json"))["rows"]


def test_streams_go_from_file_to_s3_to_sftp_byte_for_byte_and_restore_reads_any_copy(
        site, s3_server, s3_bucket, sftpd, sftp_dir):
    path = f"{sftp_dir}/zbak"
    write_config(site, {"local": f'url = "file://{site.tmp / "local"}"',
                        "cloud": s3_table(s3_server, s3_bucket),
                        "box": f'url = "sftp://box{path}"'},
                 head=hosts_table("box", sftpd.host_config()),
                 tail='[jobs.data.copy.cloud]\nstorage_class = { full = "STANDARD_IA" }\n'
                      '[jobs.data.copy.box]\nfrom = "cloud"\n')
    site.ok("init")
    site.snapshot_steps(range(1), size=3 * MIB)
    site.ok("archive")
    site.snapshot_steps(range(1, 3), size=2 * MIB)
    site.ok("archive")

    # `zbak copy` copies to every [jobs.data.copy.STORE], in the config's order: the box from
    # the cloud once the cloud holds the streams.
    dry = copied(site, "--dry-run")
    assert [(r["to"], r["stream"], r["result"]) for r in dry] == [
        ("cloud", "full @0", "planned"), ("cloud", "incremental @0 -> @2", "planned")], dry
    rows = copied(site)
    assert [(r["from"], r["to"], r["stream"], r["result"]) for r in rows] == [
        ("local", "cloud", "full @0", "copied"),
        ("local", "cloud", "incremental @0 -> @2", "copied"),
        ("cloud", "box", "full @0", "copied"),
        ("cloud", "box", "incremental @0 -> @2", "copied")], rows
    assert int(rows[0]["volumes"].split()[0]) >= 3, rows  # 3 MiB of random data, 1 MiB volumes
    assert copied(site) == []  # nothing lacking: a no-op
    with catalog_of(site.config) as catalog:
        assert [s.storage_class for s in catalog.streams(dataset=site.data, store="cloud")] == [
            "STANDARD_IA", "STANDARD"]  # the copy's storage_class, else the store's
    for store in ("local", "cloud", "box"):
        assert problems_in(site, store) == [], store
    with catalog_of(site.config) as catalog:
        by_store: dict[str, list[tuple[str, ...]]] = {}
        for stream, volumes in catalogued(catalog, site.data):
            by_store.setdefault(stream.store, []).append(
                (stream.object_prefix, *(v.sha256 for v in volumes)))
    assert by_store["local"] == by_store["cloud"] == by_store["box"]  # byte-identical volumes

    # Restore chooses among the copies by the cost order (equal here: by name) and says
    # which it read; a copy that lost a volume is passed over with its problem.
    lost = next(sftpd.local(path).rglob("vol-000001.zst"))
    lost.unlink()
    into = f"{site.pool}/back"
    plan = json.loads(site.ok("restore", site.data, "--to", "@2", "--into", into,
                                      "--from", "archive", "--dry-run", "--json"))
    options = {o["from"]: o for o in plan["options"] if o["source"] == "archive"}
    assert sorted(options) == ["box", "cloud", "local"], plan["options"]
    assert options["box"]["problem"] and not options["cloud"]["problem"], options
    assert plan["plan"].endswith("from archive cloud"), plan
    out = site.ok("restore", site.data, "--to", "@2", "--into", into, "--from",
                          "archive", "--yes")
    assert "from archive cloud" in out, out
    assert restored_content(into) == content_of(f"{site.data}@2", site.pool, "back")
    findings = json.loads(site.run("audit", "--json").out)["findings"]
    key = str(lost.relative_to(sftpd.local(path)))
    assert {f["store"] for f in findings} == {"box"}, findings  # each store audited on its own
    assert any(f["key"] == key for f in findings), findings

    # A stream marked bad in the source is never copied, and says why.
    site.snapshot_steps(range(3, 4))
    site.ok("archive")
    with catalog_of(site.config) as catalog:
        newest = catalog.streams(dataset=site.data, store="local")[-1]
        catalog.set_stream_state(newest.id, "bad", newest.created_at, reason="volume 0 rotted")
    rows = copied(site, "--to", "cloud")
    assert [(r["stream"], r["result"], r["problem"]) for r in rows] == [
        ("incremental @2 -> @3", "skipped", "marked bad in store local: volume 0 rotted")], rows
    with catalog_of(site.config) as catalog:
        assert [s.to_name for s in catalog.streams(dataset=site.data, store="cloud")] == ["0", "2"]


def s3_volumes(client, bucket: str) -> list[str]:
    """The volume keys in the S3 store of ``s3_table`` (bucket ``bucket``)."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix="zbak/local/")
    return [o["Key"] for o in listed.get("Contents", ()) if "/vol-" in o["Key"]]


def multipart_in_flight(client, bucket: str) -> bool:
    """For ``Site.kill_when``: a volume arrived in bucket ``bucket`` and the next one's
    multipart upload has a part."""
    if not s3_volumes(client, bucket):
        return False
    for upload in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        try:
            if client.list_parts(Bucket=bucket, Key=upload["Key"],
                                 UploadId=upload["UploadId"]).get("Parts"):
                return True
        except botocore.exceptions.ClientError:
            pass  # NoSuchUpload: it completed between the two calls
    return False


def test_a_copy_killed_mid_volume_resumes_keeps_what_arrived_and_leaves_no_orphan(
        site, s3_server, s3_bucket):
    """file:// -> S3 in 32 MiB volumes, each a multipart upload of four 8 MiB parts (the
    store's default part size): the kill lands once a volume arrived and the next one's
    upload has a part, which the rerun aborts once the stream is done."""
    source = site.tmp / "a"
    write_config(site, {"a": f'url = "file://{source}"',
                        "b": f"{s3_table(s3_server, s3_bucket)}\n{PACED}"}, volume=PACED_VOLUME)
    site.ok("init")
    (site.mount / "big.bin").write_bytes(os.urandom(64 * MIB))
    zfs("snapshot", f"{site.data}@big")
    site.ok("archive")
    client = s3_server.client()
    site.kill_when(lambda: multipart_in_flight(client, s3_bucket), "copy", "--to", "b")
    arrived = len(s3_volumes(client, s3_bucket))
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads"), \
        "the kill should have left a multipart upload open"
    with catalog_of(site.config) as catalog:
        assert catalog.streams(dataset=site.data, store="b") == []  # nothing recorded yet

    (row,) = copied(site, "--to", "b")
    written, kept = (int(part.split()[0]) for part in row["volumes"].split(", "))
    assert row["result"] == "copied" and kept >= arrived >= 1, row
    assert written + kept == 3, row  # 64 MiB of random data and the stream's headers
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert problems_in(site, "a") == [] and problems_in(site, "b") == []
    assert json.loads(site.run("audit", "--json").out)["findings"] == []
    into = f"{site.pool}/back"
    site.ok("restore", site.data, "--to", "@big", "--into", into, "--from", "b", "--yes")
    assert restored_content(into) == content_of(f"{site.data}@big", site.pool, "big")


def test_a_volume_arriving_other_than_the_catalog_says_is_deleted_and_nothing_is_recorded(site):
    """A source volume whose bytes changed (same size) reaches the target with another SHA-256:
    the copy stops with exit 1 naming the volume, deletes what arrived and records nothing. A
    volume already in the target with the right size but other bytes (not one an earlier
    copy checked) is not kept: it is put again. A target whose catalog export is gone while
    the catalog has streams there is refused as rolled back."""
    source, target = site.tmp / "a", site.tmp / "b"
    write_config(site, {"a": f'url = "file://{source}"', "b": f'url = "file://{target}"'})
    site.ok("init")
    site.snapshot_steps(range(1), size=2 * MIB)
    site.ok("archive")
    first = next(source.rglob("vol-000000.zst"))
    good = first.read_bytes()
    first.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))

    done = site.run("copy", "--to", "b")
    assert done.returncode == ExitStatus.FAILED, done
    assert "vol-000000.zst of stream 1 arrived in store b with sha256" in done.stdout, done.stdout
    assert not list(target.rglob("vol-*")), sorted(target.rglob("*"))
    with catalog_of(site.config) as catalog:
        assert catalog.streams(dataset=site.data, store="b") == []

    first.write_bytes(good)
    planted = target / first.relative_to(source)
    planted.write_bytes(bytes(len(good)))  # the right size, other bytes
    (row,) = copied(site, "--to", "b")
    assert (row["result"], row["volumes"]) == ("copied", "3 written, 0 kept"), row
    assert planted.read_bytes() == good
    assert problems_in(site, "b") == []

    # b rolled back (its catalog export gone) while the catalog has streams there: refused.
    shutil.rmtree(target / "_zbak")
    done = site.run("copy", "--to", "b")
    assert done.returncode == ExitStatus.FAILED and "was rolled back" in done.stderr, done


def test_copy_refuses_bad_input_with_one_line_and_the_usage_status(site):
    write_config(site, {"a": f'url = "file://{site.tmp / "a"}"'})
    for args, says in ((("--to", "a"), "--from and --to are both store a"),
                       (("--to", "nowhere"), "store 'nowhere' is not under [stores]")):
        done = site.run("copy", *args)
        assert done.returncode == ExitStatus.USAGE, done
        assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert Path(site.tmp / "a").exists() is False  # nothing was created


def test_store_a_and_the_catalog_lost_rebuild_from_b_restore_everything_then_refill_a(site):
    """The 3-2-1 disaster: store A (the archive store) and the catalog are gone. ``zbak catalog
    rebuild B`` brings the chains back from B's manifests, every snapshot restores from B with
    its guid and files, and ``zbak copy --from B --to A`` refills A: the catalog holds none of
    the job's streams in A, so this machine's export mark of A (which a wiped A is behind) no
    longer blocks it, and the copy checks every volume it puts."""
    source, target = site.tmp / "a", site.tmp / "b"
    write_config(site, {"a": f'url = "file://{source}"', "b": f'url = "file://{target}"'},
                 tail='[jobs.data.copy.b]\n')
    site.ok("init")
    site.snapshot_steps(range(1))
    site.ok("archive")
    site.snapshot_steps(range(1, 3))
    site.ok("archive")
    site.ok("copy")
    guids = {name: prop(f"{site.data}@{name}", "guid") for name in ("0", "2")}
    contents = {name: content_of(f"{site.data}@{name}", site.pool, f"c{name}") for name in guids}

    shutil.rmtree(source)
    for db in (site.tmp / "state").glob("catalog.sqlite*"):
        db.unlink()
    site.ok("init")
    site.ok("catalog", "rebuild", "b")
    for name in guids:
        into = f"{site.pool}/back{name}"
        out = site.ok("restore", site.data, "--to", f"@{name}", "--into", into, "--from", "b",
                      "--yes")
        assert "from archive b" in out, out
        assert prop(f"{into}@{name}", "guid") == guids[name]
        assert restored_content(into) == contents[name]

    dry = copied(site, "--from", "b", "--to", "a", "--dry-run")  # forgets nothing, refuses not
    assert [(r["stream"], r["result"]) for r in dry] == [
        ("full @0", "planned"), ("incremental @0 -> @2", "planned")], dry
    rows = copied(site, "--from", "b", "--to", "a")
    assert [(r["stream"], r["result"]) for r in rows] == [
        ("full @0", "copied"), ("incremental @0 -> @2", "copied")], rows
    assert problems_in(site, "a") == [] and problems_in(site, "b") == []
    assert json.loads(site.run("audit", "--json").out)["findings"] == []
    site.ok("archive")  # the archive goes on in the refilled store


def age_recipient(path: Path) -> str:
    """``age-keygen -o PATH``; the public key (``age1...``)."""
    subprocess.run(["age-keygen", "-o", str(path)], check=True, capture_output=True)
    return subprocess.run(["age-keygen", "-y", str(path)], check=True, capture_output=True,
                          text=True).stdout.strip()


def sealed_table(name: str, directory: Path, recipient: str) -> str:
    """The lines of a ``file://`` store's table sealed to ``recipient`` (docs/sealed.md)."""
    return f'url = "file://{directory}"\n[stores.{name}.age]\nrecipients = ["{recipient}"]'


def raw_volumes(store: Path, key: Path | None = None) -> dict[str, bytes]:
    """The raw bytes (what zfs send wrote) of every volume under the ``file://`` store
    ``store``, by key: each age file decrypted with the identity file ``key`` first (pyrage),
    then its zstd frame decompressed."""
    identities = ([pyrage.x25519.Identity.from_str(line) for line in key.read_text().split()
                   if line.startswith("AGE-SECRET-KEY-")] if key else [])
    raw = {}
    for path in sorted(store.rglob("vol-*.zst")):
        data = path.read_bytes()
        if key is not None:
            assert data.startswith(b"age-encryption.org/v1\n"), path
            data = pyrage.decrypt(data, identities)
        assert data.startswith(ZSTD_MAGIC), path
        raw[str(path.relative_to(store))] = zstandard.ZstdDecompressor().decompressobj(
            ).decompress(data)
    return raw


def test_copies_into_stores_of_other_codec_chains_re_encode_every_volume(site):
    """docs/copies.md#codec-chains: a plain store copied into one sealed to key 1 (no identity
    needed), that one into a store sealed to key 1 too (byte for byte), into one sealed to
    key 2 (with key 1) and from there into a plain one (with key 2). Every re-encoded copy
    holds the same raw send stream in volumes of its own chain, a manifest of its own, no
    hash of the plain volumes nor of the raw bytes; a sealed source without an identity (a
    dry run too) or with one that is not its recipient is refused with exit 2 naming it
    before anything is put; the sealed copy restores."""
    keys = {name: site.tmp / f"{name}.key" for name in ("one", "two")}
    one, two = age_recipient(keys["one"]), age_recipient(keys["two"])
    stores = {name: site.tmp / name for name in ("a", "one", "same", "two", "plain")}
    write_config(site, {"a": f'url = "file://{stores["a"]}"',
                        "one": sealed_table("one", stores["one"], one),
                        "same": sealed_table("same", stores["same"], one),
                        "two": sealed_table("two", stores["two"], two),
                        "plain": f'url = "file://{stores["plain"]}"'})
    site.ok("init")
    site.snapshot_steps(range(1), size=2 * MIB)
    site.ok("archive")
    site.snapshot_steps(range(1, 3))
    site.ok("archive")
    streams = ["full @0", "incremental @0 -> @2"]

    def copies(*args: str) -> list[tuple[str, str, str]]:
        return [(r["stream"], r["result"], r["codec"]) for r in copied(site, *args)]

    assert copies("--to", "one") == [(s, "copied", "zstd -> zstd+age") for s in streams]
    for args, says in (((), "store two writes zstd+age, so store one's zstd+age streams are"
                            " re-encoded for it: store one is sealed (age): reading its"
                            " volumes needs an identity"),
                       (("--dry-run",), "store one is sealed (age)"),
                       (("--identity", str(keys["two"])),
                        "the age header opens with none of the identities given")):
        done = site.run("copy", "--from", "one", "--to", "two", *args)
        assert done.returncode == ExitStatus.USAGE, done
        assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
        assert not list(stores["two"].rglob("vol-*")), sorted(stores["two"].rglob("*"))
    assert copies("--from", "one", "--to", "same") == [(s, "copied", "zstd+age")
                                                       for s in streams]
    assert copies("--from", "one", "--to", "two", "--identity", str(keys["one"])) == [
        (s, "copied", "zstd+age -> zstd+age") for s in streams]
    assert copies("--from", "two", "--to", "plain", "--identity", str(keys["two"])) == [
        (s, "copied", "zstd+age -> zstd") for s in streams]

    raw = raw_volumes(stores["a"])
    assert len(raw) >= 4, raw.keys()
    for name, key in (("one", keys["one"]), ("same", keys["one"]), ("two", keys["two"]),
                      ("plain", None)):
        assert raw_volumes(stores[name], key) == raw, name  # the same send stream
        assert problems_in(site, name) == [], name
    with catalog_of(site.config) as catalog:
        stored = {store: {v.sha256 for s, vs in catalogued(catalog, site.data) if s.store == store
                          for v in vs} for store in stores}
        assert {s.store: s.compression for s, _ in catalogued(catalog, site.data)} == {
            "a": "zstd", "one": "zstd+age", "same": "zstd+age", "two": "zstd+age",
            "plain": "zstd"}
        # what a later archive into a copy's store compares (docs/sealed.md#changing-the-recipients)
        assert {(s.store, s.sealed_to) for s, _ in catalogued(catalog, site.data)} == {
            ("a", None), ("one", (one,)), ("same", (one,)), ("two", (two,)), ("plain", None)}
    assert stored["same"] == stored["one"]  # byte for byte
    assert not stored["one"] & stored["a"] and not stored["two"] & (stored["a"] | stored["one"])
    # A reader of a sealed copy learns no hash of the plain volumes nor of the raw bytes.
    hashes = stored["a"] | stored["plain"] | {
        h(data).hexdigest() for data in raw.values() for h in (hashlib.sha256, blake3.blake3)}
    for name in ("one", "two"):
        manifests = [json.loads(p.read_bytes()) for p in stores[name].rglob("manifest.json")]
        assert [m["codec"] for m in manifests] == [["zstd", "age"]] * 2, name
        everything = b"".join(p.read_bytes() for p in stores[name].rglob("*") if p.is_file())
        assert not [h for h in hashes if h.encode() in everything], name
    assert json.loads(site.run("audit", "--json").out)["findings"] == []

    into = f"{site.pool}/back"
    out = site.ok("restore", site.data, "--to", "@2", "--into", into, "--from", "one",
                  "--identity", str(keys["one"]), "--yes")
    assert "from archive one" in out, out
    assert prop(f"{into}@2", "guid") == prop(f"{site.data}@2", "guid")
    assert restored_content(into) == content_of(f"{site.data}@2", site.pool, "c2")


def test_streams_sealed_before_the_recipients_changed_are_re_encoded_for_the_new_ones(site):
    """docs/sealed.md#changing-the-recipients: stores ``one`` and ``same`` are sealed to key
    one, ``one`` is archived, then both are sealed to key two. The streams of ``one`` stay
    sealed to key one (the catalog records it), so a copy into ``same`` re-encodes them
    (with key one's identity) instead of copying age files key two cannot open: the copy
    restores with key two alone. Without an identity the copy is refused before anything is
    put. (Compared with ``one``'s recipients now, they were copied byte for byte.)"""
    keys = {name: site.tmp / f"{name}.key" for name in ("one", "two")}
    one, two = age_recipient(keys["one"]), age_recipient(keys["two"])
    stores = {name: site.tmp / name for name in ("one", "same")}
    write_config(site, {name: sealed_table(name, stores[name], one) for name in stores})
    site.ok("init")
    site.snapshot_steps(range(2))
    site.ok("archive")
    streams = ["full @0", "incremental @0 -> @1"]
    site.config.write_text(site.config.read_text().replace(one, two))

    done = site.run("copy", "--from", "one", "--to", "same")
    assert done.returncode == ExitStatus.USAGE, done
    assert "needs an identity" in done.stderr and not list(stores["same"].rglob("vol-*"))
    assert [(r["stream"], r["result"], r["codec"]) for r in copied(
        site, "--from", "one", "--to", "same", "--identity", str(keys["one"]))] == [
            (s, "copied", "zstd+age -> zstd+age") for s in streams]
    with catalog_of(site.config) as catalog:
        assert {(s.store, s.sealed_to) for s, _ in catalogued(catalog, site.data)} == {
            ("one", (one,)), ("same", (two,))}
    into = f"{site.pool}/back"
    out = site.ok("restore", site.data, "--to", "@1", "--into", into, "--from", "same",
                  "--identity", str(keys["two"]), "--yes")
    assert "from archive same" in out, out
    assert restored_content(into) == content_of(f"{site.data}@1", site.pool, "c1")


def test_a_re_encoded_copy_checks_the_send_stream_and_the_volumes_it_reads(site):
    """A copy is checked before its manifest is written: a source manifest (checksum intact)
    listing a snapshot the stream does not carry stops a byte copy (plain store c) and a
    re-encoding one (sealed store b) with exit 1; then a source volume that decodes to the
    right bytes but is not the catalog's (recompressed at another level) stops the
    re-encoding one; nothing of the stream stays in the target."""
    recipient = age_recipient(site.tmp / "one.key")
    source, target, plain = site.tmp / "a", site.tmp / "b", site.tmp / "c"
    write_config(site, {"a": f'url = "file://{source}"',
                        "b": sealed_table("b", target, recipient),
                        "c": f'url = "file://{plain}"'})
    site.ok("init")
    site.snapshot_steps(range(1))
    site.ok("archive")
    manifests = {path: path.read_bytes() for path in source.rglob("manifest.json*")}
    for path, data in manifests.items():  # a snapshot @ghost the stream does not carry
        manifest = Manifest.from_json(data, str(path))
        (carried,) = manifest.snapshots
        ghost = CarriedSnapshot("ghost", carried.guid ^ 1, carried.createtxg - 1)
        path.write_bytes(dataclasses.replace(manifest, snapshots=(ghost, carried)).to_json())

    def refused(says: str, store: str = "b") -> None:
        done = site.run("copy", "--to", store, "--json")
        assert done.returncode == ExitStatus.FAILED, done
        (row,) = json.loads(done.stdout)["rows"]
        assert row["result"] == "failed" and says in row["problem"], row
        there = site.tmp / store
        assert not [p for p in there.rglob("*") if "/_zbak/" not in str(p) and p.is_file()]
        with catalog_of(site.config) as catalog:
            assert catalog.streams(dataset=site.data, store=store) == []

    refused("carries other snapshots than the catalog's stream 1", "c")
    refused("carries other snapshots than the catalog's stream 1")
    for path, data in manifests.items():
        path.write_bytes(data)
    first = next(source.rglob("vol-000000.zst"))
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(first.read_bytes())
    first.write_bytes(zstandard.ZstdCompressor(level=19, write_checksum=True).compress(raw))
    refused("vol-000000.zst of stream 1 holds")


def test_a_re_encoding_copy_killed_mid_volume_starts_the_stream_again_and_converges(
        site, s3_server, s3_bucket):
    """plain file:// -> sealed S3 in 32 MiB volumes, each a multipart upload of four 8 MiB
    parts: the kill lands once a volume arrived and the next one's upload has a part; the
    rerun puts every volume again (age encrypts anew, so nothing the killed run put can be
    checked), aborts the upload the kill left open, and the deep audit with the identity
    finds every store clean."""
    key = site.tmp / "one.key"
    source = site.tmp / "a"
    write_config(site, {"a": f'url = "file://{source}"',
                        "b": f"{s3_table(s3_server, s3_bucket)}\n{PACED}"
                        + f'\n[stores.b.age]\nrecipients = ["{age_recipient(key)}"]'},
                 volume=PACED_VOLUME)
    site.ok("init")
    (site.mount / "big.bin").write_bytes(os.urandom(64 * MIB))
    zfs("snapshot", f"{site.data}@big")
    site.ok("archive")
    client = s3_server.client()
    site.kill_when(lambda: multipart_in_flight(client, s3_bucket), "copy", "--to", "b")
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads"), \
        "the kill should have left a multipart upload open"
    with catalog_of(site.config) as catalog:
        assert catalog.streams(dataset=site.data, store="b") == []
    (row,) = copied(site, "--to", "b")
    assert (row["result"], row["codec"]) == ("copied", "zstd -> zstd+age"), row
    assert row["volumes"] == f"{len(list(source.rglob('vol-*')))} written, 0 kept", row
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert problems_in(site, "a") == [] and problems_in(site, "b") == []
    deep = json.loads(site.ok("audit", "--deep", "--identity", str(key), "--json"))
    assert deep["findings"] == [], deep


def test_each_store_prunes_by_its_own_retention_and_keeps_the_last_copy_another_store_keeps(
        site):
    """docs/copies.md#retention-per-store, on two file:// stores: a short retention in the copy
    store prunes there only (and the next copy does not bring the pruned chain back); then a
    short retention in the archive store keeps the one chain the copy store's retention keeps
    but lacks (its copy lags), saying why in ``prune --dry-run``, and lets it go once copied."""
    stores = {"a": f'url = "file://{site.tmp / "a"}"', "b": f'url = "file://{site.tmp / "b"}"'}

    def configure(keep_a: int, keep_b: int) -> None:
        write_config(site, stores, tail=f"keep_chains = {keep_a}\n[jobs.data.copy.b]\n"
                                        f"retention = {{ keep_chains = {keep_b} }}\n")

    def held(store: str) -> list[str]:
        """The fulls of store ``store`` the catalog and the store's directory both hold."""
        with catalog_of(site.config) as catalog:
            names = [s.to_name for s in catalog.streams(dataset=site.data, store=store)]
        assert problems_in(site, store) == [], store
        return names

    def prune(*args: str) -> dict[tuple[str, str], tuple[str, list[str]]]:
        """``prune ARGS --json``'s action and reasons by (store, stream)."""
        rows = json.loads(site.ok("prune", *args, "--json"))["streams"]
        return {(r["store"], r["stream"]): (r["action"], r["reasons"]) for r in rows}

    configure(3, 1)
    two_fulls_copied(site)
    found = prune()
    assert found["b", "full @0"][0] == "delete" and found["a", "full @0"][0] == "keep", found
    assert held("a") == ["0", "1"] and held("b") == ["1"]
    assert [(r["stream"], r["result"], r["problem"]) for r in copied(site)] == [
        ("full @0", "skipped", "its chain is beyond the retention of the store copied to")]

    configure(1, 3)  # b now keeps three chains, a one; b's copy lags behind a new full @2
    site.snapshot_steps(range(2, 3), size=64 * 1024)
    site.ok("archive", "--full")
    verify(site, "2")
    found = prune("--dry-run")
    assert found["a", "full @1"][0] == "delete", found  # b holds it
    assert found["a", "full @0"] == ("keep", [
        f"the last sound copy of @0 (stream {stream_id(site, 'a', '0')}): the retention of"
        " store b keeps its chain and no other store holds it sound (zbak copy --to b first)"])
    site.ok("prune")
    assert held("a") == ["0", "2"] and held("b") == ["1"]
    copied(site)
    site.ok("prune")
    assert held("a") == ["2"] and held("b") == ["0", "1", "2"]


def test_a_copy_a_delete_relies_on_is_rechecked_at_delete_time_and_the_chain_kept_when_gone(
        site):
    """docs/decisions.md#a-copy-relied-on-is-rechecked-at-delete-time: store a keeps one chain,
    b three, so a's prune deletes the old full @0 because b holds a sound copy of it. Between
    the plan (b listed) and a's deletes, b's copy of @0 is removed (``ZBAK_FAULT_RUN_BEFORE`` of
    ``support/crash_runner.py``, at a's re-check of the releasing chain @1): a keeps @0 and
    says why in one line, and @0 still restores from a."""
    write_config(site, {"a": f'url = "file://{site.tmp / "a"}"',
                        "b": f'url = "file://{site.tmp / "b"}"'},
                 tail="keep_chains = 1\n[jobs.data.copy.b]\nretention = { keep_chains = 3 }\n")
    two_fulls_copied(site)
    with catalog_of(site.config) as catalog:
        rows = {(s.store, s.to_name): s for s in catalog.streams(dataset=site.data)}
    gone = site.tmp / "b" / rows["b", "0"].object_prefix
    at = {"at": f"a\tstat\t{rows['a', '1'].object_prefix}", "argv": ["rm", "-r", str(gone)]}
    ran = faulty_zbak("--config", str(site.config), "prune", "--json",
                      env={"ZBAK_FAULT_RUN_BEFORE": json.dumps(at)})
    assert ran.status == ExitStatus.OK and not gone.exists(), ran
    found = {(r["store"], r["stream"]): (r["action"], r["reasons"])
             for r in json.loads(ran.out)["streams"]}
    action, reasons = found["a", "full @0"]
    assert action == "keep" and reasons[-1].startswith(
        "its delete relied on the copy of @0 in store b, not sound at delete time (b: "), found
    said = [line.split(" ", 1)[1] for line in ran.err.splitlines() if "kept the chain" in line]
    assert said == [
        f"WARNING zrepl_py.pruning.chain_delete: kept the chain @0 (stream {rows['a', '0'].id})"
        f" of {site.data} in store a: {reasons[-1]}"], ran.err
    into = f"{site.pool}/back"
    site.ok("restore", site.data, "--to", "@0", "--into", into, "--from", "a", "--yes")
    assert restored_content(into) == content_of(f"{site.data}@0", site.pool, "back")


def two_fulls_copied(site) -> None:
    """``zbak init``, then fulls @0 and @1 archived and each copied to the copy stores; @1
    verified."""
    site.ok("init")
    for step in range(2):
        site.snapshot_steps(range(step, step + 1), size=64 * 1024)
        site.ok("archive", "--full")
        copied(site)
    verify(site, "1")


def verify(site, snap: str) -> None:
    """The full @SNAP verified (as ``zbak audit --deep`` marks it) in every store."""
    with catalog_of(site.config) as catalog:
        for s in catalog.streams(dataset=site.data):
            if s.to_name == snap:
                catalog.set_stream_state(s.id, "verified", s.created_at)


def stream_id(site, store: str, snap: str) -> int:
    """The catalog id of the full @SNAP in ``store``."""
    with catalog_of(site.config) as catalog:
        (found,) = [s.id for s in catalog.streams(dataset=site.data, store=store)
                    if s.to_name == snap]
    return found


def volume_traffic(proxy: S3Proxy, since: int = 0) -> list[str]:
    """The requests to the proxy from index ``since`` on that moved a volume's bytes through
    this host: a GET of a volume, or a PutObject or UploadPart of one (a CopyObject sends
    no body)."""
    return [f"{r.method} {r.path}" for r in proxy.requests[since:]
            if of_volume(r.path) and (r.method == "GET" or r.uploads_bytes)]


def volume_copies(proxy: S3Proxy, bucket: str, since: int = 0) -> list[str]:
    """The paths of the PUTs of volumes into ``bucket`` without a body: CopyObjects."""
    return [r.path for r in proxy.requests[since:] if r.method == "PUT" and of_volume(r.path)
            and r.path.startswith(f"/{bucket}/") and not r.uploads_bytes]


def of_volume(path: str) -> bool:
    """Whether a request path names a volume's bytes (not its lock: ``?retention``)."""
    return "/vol-" in path and "?retention" not in path


@pytest.fixture
def proxied(s3_server):
    """``proxied(**kw)``: an ``S3Proxy`` in front of moto's server, closed after the test
    (zbak's config names it as the endpoint, so every check of the stores goes through it)."""
    proxies: list[S3Proxy] = []

    def start(**kw) -> S3Proxy:
        proxies.append(S3Proxy(s3_server.endpoint_url, **kw))
        return proxies[-1]

    yield start
    for proxy in proxies:
        proxy.close()


def second_bucket(client, bucket: str, **create) -> str:
    """A new bucket beside ``bucket`` on the same server (CreateBucket ``create``); its name."""
    client.create_bucket(Bucket=f"{bucket}-b", **create)
    return f"{bucket}-b"


def inside_s3_site(site, source: str, target: str, proxy: S3Proxy, *, volume: int,
                   size: int, lock: str = "", region: str = "us-east-1") -> int:
    """Stores ``a`` (bucket ``source``, the archive store) and ``b`` (bucket ``target``,
    with ``lock``'s lines) on one endpoint, the proxy, in ``volume``-byte volumes; a full of
    ``size`` bytes of random data archived to ``a``; ``b`` in ``region``. The number of
    requests the proxy saw."""
    def table(bucket: str, region: str = "us-east-1") -> str:
        return f'url = "s3://{bucket}/zbak"\nendpoint = "{proxy.url}"\nregion = "{region}"'
    write_config(site, {"a": table(source), "b": table(target, region) + lock}, volume=volume)
    site.ok("init")
    site.snapshot_steps(range(1), size=size)
    site.ok("archive")
    return len(proxy.requests)


def test_s3_to_s3_on_one_endpoint_copies_inside_s3_single_and_multipart_into_a_lock_store(
        site, s3_server, s3_bucket, proxied):
    """Volumes of 12 MiB: the first a multipart upload (8 + 4 MiB parts, so S3 keeps only a
    composite checksum of it), the last one PutObject. Each reaches the Object Lock store
    ``b`` by a CopyObject whose full-object SHA-256 is the catalog's, locked as ``b`` locks."""
    client = s3_server.client()
    target = second_bucket(client, s3_bucket, ObjectLockEnabledForBucket=True)
    proxy = proxied()
    since = inside_s3_site(site, s3_bucket, target, proxy, volume=12 * MIB, size=14 * MIB,
                           lock='\nobject_lock = { mode = "governance", period = "2d" }')
    with catalog_of(site.config) as catalog:
        (stream,) = catalog.streams(dataset=site.data, store="a")
        keys = [v.key for v in catalog.volumes(stream.id)]
    assert len(keys) == 2, keys
    first = client.head_object(Bucket=s3_bucket, Key=f"zbak/{keys[0]}")
    assert first["ETag"].strip('"').endswith("-2"), first  # a multipart upload

    (row,) = copied(site, "--to", "b")
    assert (row["result"], row["volumes"]) == ("copied", "2 written, 0 kept"), row
    assert volume_traffic(proxy, since) == []
    assert sorted(volume_copies(proxy, target, since)) == sorted(
        f"/{target}/zbak/{key}" for key in keys)
    assert problems_in(site, "a") == [] and problems_in(site, "b") == []
    with catalog_of(site.config) as catalog:
        rows = {s.store: catalog.volumes(s.id) for s in catalog.streams(dataset=site.data)}
    assert [v.sha256 for v in rows["a"]] == [v.sha256 for v in rows["b"]], rows
    for key, volume in zip(keys, rows["b"], strict=True):
        head = client.head_object(Bucket=target, Key=f"zbak/{key}", ChecksumMode="ENABLED")
        assert base64.b64decode(head["ChecksumSHA256"]).hex() == volume.sha256, head
        assert head["ObjectLockMode"] == "GOVERNANCE", head
        # The copy's version and lock are recorded, as archive records its own: restore and
        # audit read that version, the rolling lock extends it, prune waits for it.
        assert (volume.version_id, volume.retain_until) == (
            head["VersionId"], head["ObjectLockRetainUntilDate"]), (volume, head)


def test_a_copy_inside_s3_answering_another_sha256_is_deleted_and_nothing_is_recorded(
        site, s3_server, s3_bucket, proxied):
    """The proxy rewrites the SHA-256 of the second CopyObject's answer: the copy stops with
    exit 1 naming that volume, the arrived object is deleted and no row of ``b`` recorded."""
    client = s3_server.client()
    target = second_bucket(client, s3_bucket)
    wrong = base64.b64encode(hashlib.sha256(b"other bytes").digest())

    def rewrite(method: str, path: str, status: int, body: bytes) -> tuple[int, bytes]:
        if method == "PUT" and path.startswith(f"/{target}/") and "vol-000001" in path:
            body = re.sub(rb"<ChecksumSHA256>[^<]*</ChecksumSHA256>",
                          b"<ChecksumSHA256>" + wrong + b"</ChecksumSHA256>", body)
        return status, body

    proxy = proxied(rewrite=rewrite)
    since = inside_s3_site(site, s3_bucket, target, proxy, volume=MIB, size=2 * MIB)
    done = site.run("copy", "--to", "b")
    assert volume_traffic(proxy, since) == []
    assert done.returncode == ExitStatus.FAILED, done
    assert "vol-000001.zst of stream 1 arrived in store b with sha256" in done.stdout, done
    listed = client.list_objects_v2(Bucket=target, Prefix="zbak/").get("Contents", ())
    assert [o["Key"] for o in listed if "/vol-000001" in o["Key"]] == [], listed
    with catalog_of(site.config) as catalog:
        assert catalog.streams(dataset=site.data, store="b") == []


def test_a_copy_inside_s3_killed_while_s3_copies_a_volume_reruns_and_converges(
        site, s3_server, s3_bucket, proxied):
    """The proxy holds the CopyObject of the second volume until zbak is killed (SIGKILL),
    then answers 503: the rerun keeps the first volume (its full-object SHA-256 checked,
    not read), copies the rest inside S3, and both stores hold what the catalog says. ``b``
    is a lock store: the kept volume's version is recorded as the copied ones' are."""
    client = s3_server.client()
    target = second_bucket(client, s3_bucket, ObjectLockEnabledForBucket=True)
    held, killed = threading.Event(), threading.Event()

    def intercept(method: str, path: str) -> tuple[int, bytes] | None:
        if (method == "PUT" and path.startswith(f"/{target}/") and "vol-000001" in path
                and not killed.is_set()):
            held.set()
            killed.wait(120)
            return 503, b"<Error><Code>SlowDown</Code><Message>held</Message></Error>"
        return None

    proxy = proxied(intercept=intercept)
    since = inside_s3_site(site, s3_bucket, target, proxy, volume=MIB, size=3 * MIB,
                           lock='\nobject_lock = { mode = "governance", period = "2d" }')
    try:
        site.kill_when(held.is_set, "copy", "--to", "b")
    finally:
        killed.set()
    with catalog_of(site.config) as catalog:
        assert catalog.streams(dataset=site.data, store="b") == []
    (row,) = copied(site, "--to", "b")
    written, kept = (int(part.split()[0]) for part in row["volumes"].split(", "))
    assert row["result"] == "copied" and kept == 1 and written >= 3, row
    assert volume_traffic(proxy, since) == []
    assert problems_in(site, "a") == [] and problems_in(site, "b") == []
    assert json.loads(site.run("audit", "--json").out)["findings"] == []
    with catalog_of(site.config) as catalog:
        (stream,) = catalog.streams(dataset=site.data, store="b")
        for volume in catalog.volumes(stream.id):
            head = client.head_object(Bucket=target, Key=f"zbak/{volume.key}")
            assert (volume.version_id, volume.retain_until) == (
                head["VersionId"], head["ObjectLockRetainUntilDate"]), (volume, head)


def test_s3_stores_in_other_regions_copy_through_the_host_and_say_so_in_one_line(
        site, s3_server, s3_bucket, proxied):
    """Two ``s3://`` stores on one endpoint but in other regions (so one signature cannot
    serve both): each volume is read and put as between any two stores, checked the same
    way, and the log says once why."""
    client = s3_server.client()
    target = second_bucket(client, s3_bucket)
    proxy = proxied()
    since = inside_s3_site(site, s3_bucket, target, proxy, volume=MIB, size=2 * MIB,
                           region="eu-west-1")
    done = site.run("copy", "--to", "b")
    assert done.returncode == ExitStatus.OK, done
    said = [line for line in done.stderr.splitlines() if "not inside S3" in line]
    assert len(said) == 1 and "their regions differ (us-east-1 and eu-west-1)" in said[0], said
    traffic = volume_traffic(proxy, since)
    assert volume_copies(proxy, target, since) == [] and len(traffic) >= 6, traffic
    assert problems_in(site, "b") == []


def test_a_copy_inside_s3_answered_without_a_full_object_sha256_is_streamed_instead(
        site, s3_server, s3_bucket, proxied):
    """An S3 that answers a CopyObject without a SHA-256 (the proxy removes it): the unchecked
    copy is replaced by that volume streamed through the host and checked as it passes; the
    log says so once per such volume."""
    client = s3_server.client()
    target = second_bucket(client, s3_bucket)

    def rewrite(method: str, path: str, status: int, body: bytes) -> tuple[int, bytes]:
        if method == "PUT" and path.startswith(f"/{target}/") and "vol-000001" in path:
            body = re.sub(rb"<ChecksumSHA256>[^<]*</ChecksumSHA256>", b"", body)
        return status, body

    proxy = proxied(rewrite=rewrite)
    since = inside_s3_site(site, s3_bucket, target, proxy, volume=MIB, size=2 * MIB)
    done = site.run("copy", "--to", "b")
    assert done.returncode == ExitStatus.OK, done
    said = [line for line in done.stderr.splitlines() if "is copied through this host" in line]
    assert len(said) == 1 and "vol-000001.zst" in said[0], done.stderr
    streamed = volume_traffic(proxy, since)
    assert streamed and all("vol-000001.zst" in r for r in streamed), streamed
    assert problems_in(site, "b") == []
