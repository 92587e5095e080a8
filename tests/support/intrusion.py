"""What an intruder holding the master's S3 keys does to a store, for the tests of
``zbak catalog rebuild --not-after`` and the intruder test: a cut-off the server's clock has
passed, and a forged newer chain (a convincing manifest, checksum and all, over a junk
volume: the manifest format and its checksum are public)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import textwrap
from pathlib import Path

from support.cli import Zbak
from zrepl_py.errors import ExitStatus
from zrepl_py.objects.layout import MANIFEST, copy_key, stream_prefix, volume_key
from zrepl_py.objects.manifest import CarriedSnapshot, Manifest, VolumeRecord

FORGED_NAME = "zbak_20991231T000000Z"
LOCK = 'object_lock = { mode = "compliance", period = "3d" }'


def store_table(bucket: str, endpoint: str, region: str, *, locked: bool = True) -> str:
    """The ``[stores.cold]`` table of an S3 store in ``bucket`` (prefix ``zbak``, 1 MiB
    volumes), with ``object_lock`` when ``locked``."""
    return textwrap.dedent(f"""
        [stores.cold]
        url = "s3://{bucket}/zbak"
        endpoint = "{endpoint}"
        region = "{region}"
        volume_size = "1MiB"
        {LOCK if locked else ""}
    """)


def clean_host(directory: Path, store: str, job: str, dataset: str) -> Zbak:
    """The admin's config on a clean host: a fresh state directory in ``directory`` (made),
    the store table ``store`` and job ``job`` archiving ``dataset`` to it; ``zbak init
    --no-checks`` run; the CLI runner."""
    directory.mkdir()
    config = directory / "zbak.toml"
    config.write_text(f'state_dir = "{directory / "state"}"\n' + store
                      + f'[jobs.{job}]\ndataset = "{dataset}"\n[jobs.{job}.archive]\n'
                        'store = "cold"\n')
    run = Zbak(config)
    status, out, err = run("init", "--no-checks")
    assert status == ExitStatus.OK, out + err
    return run


def past_cutoff(client, bucket: str, cutoff: dt.datetime) -> None:
    """Return once S3's clock (the LastModified of a probe put outside the store's prefix)
    is past ``cutoff``: S3 keeps LastModified to the second, so anything written from now
    on is strictly later than ``cutoff``."""
    while True:
        client.put_object(Bucket=bucket, Key="probe/clock", Body=b"")
        if client.head_object(Bucket=bucket, Key="probe/clock")["LastModified"] > cutoff:
            return


def server_cutoff(client, bucket: str) -> dt.datetime:
    """The LastModified of the newest version in ``bucket`` (S3's clock at the last write
    the admin trusts), and the server's clock moved past it (:func:`past_cutoff`)."""
    listing = client.list_object_versions(Bucket=bucket)
    cutoff = max(v["LastModified"] for v in listing["Versions"])
    past_cutoff(client, bucket, cutoff)
    return cutoff


def forge_newer_chain(client, bucket: str, root: str, manifest_key: str) -> list[str]:
    """Write, with the master's keys, a full stream claiming snapshot ``FORGED_NAME`` newer
    than the one of ``manifest_key`` (a genuine manifest, key relative to the store ``root``
    in ``bucket``): a junk volume, its manifest and the manifest's copy. Returns the keys
    written (relative to the store root)."""
    legit = Manifest.from_json(client.get_object(
        Bucket=bucket, Key=f"{root}/{manifest_key}")["Body"].read(), manifest_key)
    fake = CarriedSnapshot(FORGED_NAME, int.from_bytes(os.urandom(8), "big"),
                           legit.to_snap.createtxg + 1000)
    prefix = stream_prefix(legit.host, legit.dataset, to_createtxg=fake.createtxg,
                           to_guid=fake.guid, from_guid=None)
    junk = os.urandom(4096)
    volume = VolumeRecord(0, volume_key(prefix, 0), len(junk), len(junk),
                          hashlib.sha256(junk).hexdigest())
    forged = dataclasses.replace(legit, kind="full", from_snap=None, to_snap=fake,
                                 snapshots=(fake,), volumes=(volume,),
                                 created_at=dt.datetime.now(dt.UTC))
    written = {volume.key: junk, prefix + MANIFEST: forged.to_json(),
               copy_key(prefix + MANIFEST): forged.to_json()}
    for key, body in written.items():
        client.put_object(Bucket=bucket, Key=f"{root}/{key}", Body=body)
    return list(written)
