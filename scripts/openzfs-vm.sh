#!/usr/bin/env bash
# The OpenZFS 2.3 QEMU guest of the `openzfs` test tier, through the shared zfsvm tool
# (../shared/zfsvm/zfsvm beside this repository; ZBAK_ZFSVM=PATH to use another copy).
#
#   scripts/openzfs-vm.sh build    build the guest image once (idempotent, needs root; cache in
#                                  ${ZFSVM_CACHE:-/var/cache/zfsvm}: cold ~5 min, then 0.02 s)
#   scripts/openzfs-vm.sh start    boot the guest (~11-27 s) and keep it up: the test fixture
#                                  then reuses it (no boot per pytest run) and never stops it
#   scripts/openzfs-vm.sh stop     power it off (its pools are lost)
#   scripts/openzfs-vm.sh status | env | ssh [CMD...]
#
# The guest's sshd is forwarded to 127.0.0.1:${ZBAK_OPENZFS_PORT:-2240}, a port of its own, so
# guests of other users of zfsvm (default port 2222, ZFSVM_PORT in their shells) are never
# touched; an ambient ZFSVM_PORT is ignored here. The tests' fixture (tests/support/openzfs.py)
# uses the same port and the same started-by-pytest marker file.
# ZBAK_OPENZFS_VM=0 makes `build` a no-op (the tier then skips locally, fails in strict mode).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
zfsvm=${ZBAK_ZFSVM:-$repo/../shared/zfsvm/zfsvm}
export ZFSVM_PORT=${ZBAK_OPENZFS_PORT:-2240}
unset ZFSVM_RUNDIR  # one run directory per port, as the fixture expects
# One emulated CPU, as the fixture boots it: less host CPU for the same guest commands
# (docs/decisions.md#the-guest-runs-one-cpu-without-aslr).
export ZFSVM_SMP=${ZFSVM_SMP:-1}
lockdir=/run/lock
[[ -d $lockdir ]] || lockdir=${TMPDIR:-/tmp}
# Present while the guest on this port was started by a pytest session, which stops it at the end.
marker=$lockdir/zbak-openzfs-$ZFSVM_PORT.started

usage() { sed -n '2,17s/^# \{0,1\}//p' "$0"; }

[[ -x $zfsvm ]] || { echo "openzfs-vm: $zfsvm not found (set ZBAK_ZFSVM)" >&2; exit 1; }
case ${1:-} in
  build)
    if [[ ${ZBAK_OPENZFS_VM:-} == 0 ]]; then
      echo "openzfs-vm: ZBAK_OPENZFS_VM=0, not building the OpenZFS guest" >&2
      exit 0
    fi
    exec "$zfsvm" build  # logs "build done in N s" after a real build
    ;;
  start)
    rm -f "$marker"  # started (or adopted) by hand: pytest sessions leave it running
    exec "$zfsvm" start
    ;;
  stop)
    rm -f "$marker"
    exec "$zfsvm" stop
    ;;
  status | env) exec "$zfsvm" "$1" ;;
  ssh) shift; exec "$zfsvm" ssh "$@" ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
