"""zfs_uploader (PyPI, boto3 on ``zfs send``), the cold path's direct peer, as one more tool of
benchmarks/archive.py's S3 cases (``--zfs-uploader VENV``; by hand, not CI).

zfs_uploader 0.9.0 does not run on zfs-fuse as it is: every send it makes is ``zfs send
--raw``, its size estimate is ``zfs send --raw --parsable --dryrun`` and it lists snapshots
with ``zfs list -p``, none of which zfs-fuse's zfs takes (``invalid option``). Its process gets
a benchmark-only ``zfs`` shim first on ``PATH`` (:data:`SHIM`) that

- drops ``--raw``: for an unencrypted dataset a raw send is the same stream (zfs-send(8):
  ``-w`` sends encrypted blocks as they are on disk; an unencrypted dataset has none);
- answers the dry run with the snapshot's ``referenced`` size (zfs_uploader only sizes its
  multipart parts by it; 8 MiB parts below 80 GB either way), not a second send;
- answers ``zfs list -p -t snapshot`` from ``zfs get -Hp used,referenced`` (exact numbers).

zfs_uploader takes its own snapshot (named by the second) and uploads the send stream
uncompressed in one object (boto3's ``upload_fileobj``, its 8 MiB parts); each run here is a
full backup to a fresh prefix (a fresh backup.db), and its snapshot and objects are removed
after the run. Install it in a venv of its own, never in zbak's, never committed::

    python3 -m venv /var/tmp/zfsup-venv && /var/tmp/zfsup-venv/bin/pip install zfs_uploader==0.9.0
"""

from __future__ import annotations

import shutil
import stat
import textwrap
from pathlib import Path

SHIM = textwrap.dedent("""\
    #!/bin/bash
    # benchmark-only zfs for zfs_uploader on zfs-fuse (benchmarks/zfs_uploader_peer.py)
    real=REAL_ZFS
    if [[ $1 == send ]]; then
      args=(); dry=0
      for a in "${@:2}"; do
        case $a in --raw|--parsable) ;; --dryrun) dry=1 ;; *) args+=("$a") ;; esac
      done
      if ((dry)); then
        printf 'full\\t%s\\nsize\\t%s\\n' "${args[-1]}" \\
          "$("$real" get -Hp -o value referenced "${args[-1]}")"
        exit 0
      fi
      exec "$real" send "${args[@]}"
    fi
    if [[ $1 == list && " $* " == *" -p "* ]]; then
      echo "NAME USED AVAIL REFER MOUNTPOINT"
      names=$("$real" list -H -o name -t snapshot) || exit 1
      [[ -z $names ]] && exit 0
      "$real" get -Hp -o name,property,value used,referenced $names | awk -F'\\t' '
        !($1 in seen) { seen[$1] = 1; order[++n] = $1 }
        { v[$1, $2] = $3 }
        END { for (i = 1; i <= n; i++) print order[i], v[order[i], "used"], "-",
                                            v[order[i], "referenced"], "-" }'
      exit
    fi
    exec "$real" "$@"
""")


def install_shim(directory: Path) -> Path:
    """Write :data:`SHIM` as ``directory/zfs`` (calling the ``zfs`` now on PATH); return
    ``directory``, to put first on zfs_uploader's PATH."""
    real = shutil.which("zfs")
    if real is None:
        raise SystemExit("zfs not found")
    directory.mkdir(parents=True, exist_ok=True)
    shim = directory / "zfs"
    shim.write_text(SHIM.replace("REAL_ZFS", real))
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return directory


def config(path: Path, *, dataset: str, bucket: str, prefix: str, endpoint: str,
           access_key: str, secret_key: str) -> Path:
    """zfs_uploader's config file at ``path``: one job, ``dataset`` to ``bucket``/``prefix``."""
    path.write_text(textwrap.dedent(f"""\
        [DEFAULT]
        bucket_name = {bucket}
        access_key = {access_key}
        secret_key = {secret_key}
        region = us-east-1
        endpoint = {endpoint}

        [{dataset}]
        prefix = {prefix}
    """))
    return path
