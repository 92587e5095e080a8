#!/usr/bin/env bash
# The README's main job: a real zbak cycle on real pools and real data.
# Creates a source and a backup pool on sparse files, fills a dataset tree with a copy of
# /usr/share/doc, then runs every zbak command that exists, with changes between snapshots.
# Pools are destroyed at the end unless ZBAK_DEMO_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
./scripts/setup-host.sh

work=${ZBAK_DEMO_DIR:-/var/tmp/zbak-demo}
src=zbakdemo_src
bak=zbakdemo_bak

cleanup() {
  [[ -f "$work/ssh/sshd.pid" ]] && kill "$(cat "$work/ssh/sshd.pid")" 2>/dev/null || true
  for pool in "$src" "$bak"; do
    if zpool list "$pool" >/dev/null 2>&1; then
      for _ in 1 2 3 4 5 6 7 8 9 10; do zpool destroy -f "$pool" 2>/dev/null && break; sleep 1; done
    fi
  done
}
cleanup
rm -rf "$work"
mkdir -p "$work"
[[ "${ZBAK_DEMO_KEEP:-0}" == 1 ]] || trap cleanup EXIT

# zfs-fuse answers "dataset is busy" for a moment after an unmount (see TESTBED.md).
retry() { for _ in 1 2 3 4 5 6 7 8 9 10; do "$@" 2>/dev/null && return 0; sleep 1; done; "$@"; }
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
zbak() { printf '$ zbak %s\n' "$*"; "$root/.venv/bin/zbak" --config "$work/zbak.toml" "$@"; }

step "pools on sparse files"
truncate -s 3G "$work/src.img" "$work/bak.img"
zpool create -m "$work/mnt/$src" "$src" "$work/src.img"
zpool create -m "$work/mnt/$bak" "$bak" "$work/bak.img"
zfs create "$src/data"
zfs create "$src/data/docs"
zfs create "$src/data/scratch"
zpool list "$src" "$bak"

step "real data: a copy of /usr/share/doc"
cp -a /usr/share/doc/. "$work/mnt/$src/data/docs/"
echo "scratch space, excluded from the job" > "$work/mnt/$src/data/scratch/tmp.txt"
zfs list -r "$src"

step "an OpenSSH server on 127.0.0.1 plays the backup host (keys made for this run)"
mkdir -p "$work/ssh" /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/host_key"
ssh-keygen -q -t ed25519 -N '' -f "$work/ssh/id_ed25519"
cp "$work/ssh/id_ed25519.pub" "$work/ssh/authorized_keys"
port=$("$root/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/ssh/sshd_config" <<SSHD
Port $port
ListenAddress 127.0.0.1
HostKey $work/ssh/host_key
AuthorizedKeysFile $work/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
StrictModes no
PidFile $work/ssh/sshd.pid
SSHD
/usr/sbin/sshd -f "$work/ssh/sshd_config"
echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$work/ssh/host_key.pub")" > "$work/ssh/known_hosts"
echo "sshd listening on 127.0.0.1:$port"

cat > "$work/zbak.toml" <<TOML
state_dir = "$work/state"

[hosts.backup]
address = "127.0.0.1"
port = $port
user = "root"
identity_file = "$work/ssh/id_ed25519"
known_hosts = "$work/ssh/known_hosts"

# The whole tree (but scratch) to the backup pool, as ZFS streams over ssh.
[jobs.demo]
dataset = "$src/data"
recursive = true
exclude = ["scratch"]

[jobs.demo.snapshot]
prefix = "zbak"
schedule = "*/15 * * * *"
retention = { keep_last = 2, hourly = 0, daily = 0 }

[jobs.demo.replicate]
targets = ["backup:$bak/data"]
compression = "zstd"

# Cold copies: chains of zstd-compressed send streams in a directory store.
[stores.cold]
url = "file://$work/cold"
volume_size = "64MiB"

[jobs.demo.archive]
store = "cold"

# The docs as plain files on a host without ZFS: the rsync fallback.
[jobs.mirror]
dataset = "$src/data/docs"

[jobs.mirror.snapshot]
prefix = "mirror"
retention = { keep_last = 2, hourly = 0, daily = 0 }

[jobs.mirror.replicate]
targets = ["backup:$work/rsync-mirror"]
TOML
step "config ($work/zbak.toml)"
cat "$work/zbak.toml"
zbak config check

step "catalog and preflight"
zbak init

step "snapshots with changes between them"
zbak snapshot
for round in 1 2 3; do
  sleep 1.1   # names have one-second resolution
  cp -a /usr/share/common-licenses "$work/mnt/$src/data/docs/licenses-round-$round"
  rm -rf "$work/mnt/$src/data/docs/$(ls "$work/mnt/$src/data/docs" | head -1)"
  zbak snapshot
done
zfs snapshot "$src/data@before-upgrade"   # a user snapshot: zbak never prunes it
zbak list snapshots demo

step "replicate: plan, then the first run (full, then -I up to the newest)"
zbak replicate --dry-run
zbak replicate
zfs list -t snapshot -o name -r "$bak/data"
zfs list -t snapshot -o name,userrefs -r "$src/data"   # zbak holds the newest replicated base

step "change files, snapshot, replicate again: incremental"
cp -a /usr/share/common-licenses "$work/mnt/$src/data/docs/licenses-after-first-replication"
echo "edited after the first replication" >> "$work/mnt/$src/data/docs/$(ls "$work/mnt/$src/data/docs" | tail -1)/README.demo"
sleep 1.1
zbak snapshot demo
zbak replicate demo

step "the replica has the source's guids and files"
diff <(zfs list -H -t snapshot -o name -r "$src/data/docs" | sed 's/^[^@]*@//') \
     <(zfs list -H -t snapshot -o name -r "$bak/data/docs" | sed 's/^[^@]*@//') && echo "same snapshots on both sides"
for snap in $(zfs list -H -t snapshot -o name -r "$src/data/docs" | sed 's/^[^@]*@//'); do
  a=$(zfs get -H -o value guid "$src/data/docs@$snap"); b=$(zfs get -H -o value guid "$bak/data/docs@$snap")
  [[ "$a" == "$b" ]] || { echo "guid mismatch for @$snap: $a != $b"; exit 1; }
done
echo "guids equal for every snapshot of $src/data/docs"
zfs mount "$bak/data/docs" 2>/dev/null || true
diff -r --no-dereference "$work/mnt/$src/data/docs" "$(zfs get -H -o value mountpoint "$bak/data/docs")" && echo "replica files identical to the source"

step "archive to a file:// store: a full of the oldest snapshot, then -I to the newest"
mkdir -p "$work/cold"
zbak archive --dry-run
zbak archive
cp -a /usr/share/common-licenses "$work/mnt/$src/data/docs/licenses-before-second-archive"
sleep 1.1
zbak snapshot demo
zbak archive demo   # an incremental on each chain
zbak list streams demo
find "$work/cold" -name manifest.json | sort

step "restore the docs from the archive into a new dataset and compare with the source snapshot"
docs_snap=$(zfs list -H -t snapshot -o name -s createtxg -r "$src/data/docs" | tail -1 | sed 's/^[^@]*@//')
zbak restore "$src/data/docs" --to "@$docs_snap" --into "$src/restored-docs" --dry-run
zbak restore "$src/data/docs" --to "@$docs_snap" --into "$src/restored-docs" --from cold --yes
zfs list -t snapshot -o name,guid -r "$src/restored-docs"
[[ "$(zfs get -H -o value guid "$src/restored-docs@$docs_snap")" == "$(zfs get -H -o value guid "$src/data/docs@$docs_snap")" ]] \
  && echo "restored @$docs_snap has the source snapshot's guid"
zfs mount "$src/restored-docs" 2>/dev/null || true
zfs clone "$src/data/docs@$docs_snap" "$src/compare-docs"   # zfs-fuse has no .zfs/snapshot
diff -r --no-dereference "$(zfs get -H -o value mountpoint "$src/compare-docs")" \
     "$(zfs get -H -o value mountpoint "$src/restored-docs")" && echo "restored files identical to the source snapshot"
retry zfs destroy "$src/compare-docs"

step "rsync fallback: the docs as hard-linked point-in-time trees"
sleep 1.1
zbak snapshot mirror
zbak replicate mirror
ls -l "$work/rsync-mirror" "$work/rsync-mirror/snapshots"
diff -r --no-dereference "$work/mnt/$src/data/docs" "$work/rsync-mirror/current/" && echo "rsync mirror identical to the source"

step "retention: hold one old snapshot, clone another, then prune"
mapfile -t ours < <(zfs list -H -o name -t snapshot -r "$src/data" | grep "^$src/data@zbak_")
zfs hold keep-for-audit "${ours[0]}"
zfs clone "${ours[1]}" "$src/restored-copy"
zbak prune demo --dry-run
zbak prune
zfs list -t snapshot -o name,userrefs -r "$src/data"
retry zfs destroy "$src/restored-copy"
zfs release keep-for-audit "${ours[0]}"

step "status"
zbak status
zbak status --json | head -30
step "audit: the chain graph, every object in the store, and a deep re-read of every volume"
zbak audit --deep
zbak list streams demo
step "done: the demo cycle completed"
