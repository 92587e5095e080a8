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

cat > "$work/zbak.toml" <<TOML
state_dir = "$work/state"

[jobs.demo]
dataset = "$src/data"
recursive = true
exclude = ["scratch"]

[jobs.demo.snapshot]
prefix = "zbak"
schedule = "*/15 * * * *"
retention = { keep_last = 2, hourly = 0, daily = 0 }
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
zbak list snapshots

step "retention: hold one old snapshot, clone another, then prune"
mapfile -t ours < <(zfs list -H -o name -t snapshot -r "$src/data" | grep "^$src/data@zbak_")
zfs hold keep-for-audit "${ours[0]}"
zfs clone "${ours[1]}" "$src/restored-copy"
zbak prune --dry-run
zbak prune
zfs list -t snapshot -o name,userrefs -r "$src/data"
retry zfs destroy "$src/restored-copy"
zfs release keep-for-audit "${ours[0]}"

step "status"
zbak status
zbak status --json | head -30
step "done: the demo cycle completed"
