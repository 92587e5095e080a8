#!/bin/sh
# Delegate to an unprivileged user exactly the ZFS permissions zbak needs (zfs-allow(8)),
# so the remote side of zbak (or zbak itself on the source) runs without root.
#
#   zfs-allow.sh [-n] source USER DATASET      # snapshots, send, holds, bookmarks, prune
#   zfs-allow.sh [-n] target USER DATASET [--rollback]
#                                              # receive; --rollback adds rollback and
#                                              # destroy for on_divergence = "rollback"
#                                              # and replica retention
#   -n   print the zfs allow command instead of running it
#
# Permissions are granted on DATASET and inherited by its descendants ("local+descendent",
# the default of zfs allow without -l/-d). What each is for, and what zfs-allow(8) adds:
#
#   source  send      zfs send (full, -I, -i from a bookmark, -t resume, -w raw)
#           snapshot  zfs snapshot of zbak_* names          (needs mount, zfs-allow(8))
#           hold      zfs hold zbak:<job>:<target> on the replication/archive base
#           release   zfs release of the previous base's hold
#           bookmark  zbak's cursor bookmark (OpenZFS), the base when a snapshot is gone
#           destroy   zbak prune of zbak's own snapshots, old cursor bookmarks
#                                                           (needs mount, zfs-allow(8))
#           mount     required by snapshot and destroy; zbak mounts nothing itself
#           userprop  zbak sets no user property today; kept for its own zbak: properties,
#                     drop it if you like
#   target  receive   zfs receive -u [-s] [-o P=V] [-x P] and receive -A
#                                                           (needs mount and create)
#           create    zfs create -p of the parents of a new replica
#           mount     required by receive and create; receives use -u, and on Linux a
#                     non-root user cannot mount anyway (mount(2) needs CAP_SYS_ADMIN), so
#                     replicas stay unmounted until root mounts them
#           hold, release, userprop   as on the source; userprop also lets the
#                     source's user properties arrive ([replicate] properties send)
#           canmount, readonly        zbak's default replica properties (receive -o
#                     canmount=noauto -o readonly=on, or zfs set after the receive)
#           compression ... volmode   the properties a stream sent with zfs send -p
#                     carries that keep a failover replica faithful; a property without
#                     its permission is not received (zfs says "cannot receive P
#                     property: permission denied" and receives the data). Add the
#                     properties of your own [replicate] properties set here.
#           rollback, destroy         only with --rollback: zfs rollback to the common
#                     snapshot and destroy of newer zbak snapshots (on_divergence =
#                     "rollback"), and replica retention
#
# zfs allow cannot say "only zbak's own snapshots": destroy is destroy. That narrowing is
# done by `zbak serve --allow-destroy-own` in the key's forced command
# (examples/authorized_keys.example), which refuses every destroy but one zbak_* snapshot
# or zbak_* bookmark at a time. Reading (zfs get/list, zpool get/status) needs no delegation.
# Never granted: allow, rename, promote, clone, share, load-key/change-key, and the
# properties that would mount, share or reserve: mountpoint, sharenfs, sharesmb,
# refreservation, reservation. So no stream can give a replica the source's mountpoint
# (a path of the backup host) or an NFS share, whatever zfs receive -x does
# (openzfs/zfs#17240); nor exec, setuid, devices: a replica keeps the backup host's.
set -eu

usage() {
    echo "usage: $0 [-n] source USER DATASET | [-n] target USER DATASET [--rollback]" >&2
    exit 2
}

run=
if [ "${1:-}" = "-n" ]; then
    run=echo
    shift
fi
[ $# -ge 3 ] || usage
role=$1 user=$2 dataset=$3
extra=${4:-}

case $role in
source)
    [ -z "$extra" ] || usage
    perms=send,snapshot,hold,release,bookmark,destroy,mount,userprop
    ;;
target)
    perms=receive,create,mount,hold,release,userprop,canmount,readonly
    perms=$perms,compression,recordsize,atime,relatime,xattr,acltype,aclinherit,aclmode
    perms=$perms,dnodesize,checksum,copies,sync,logbias,primarycache,secondarycache
    perms=$perms,snapdir,redundant_metadata,special_small_blocks,volmode
    case $extra in
    "") ;;
    --rollback) perms=$perms,rollback,destroy ;;
    *) usage ;;
    esac
    ;;
*)
    usage
    ;;
esac

$run zfs allow -u "$user" "$perms" "$dataset"
[ -n "$run" ] || zfs allow "$dataset"
