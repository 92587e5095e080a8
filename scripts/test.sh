#!/usr/bin/env bash
# The README's test command: set up the machine, then run the whole suite on real components.
# Strict mode: a test that needs zfs-fuse, sshd, the S3 server or PostgreSQL fails (never
# skips) when that component cannot be started.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-host.sh
# The house rules a tool checks (docs/style.md): lint, then types; any finding fails the run
# before a test starts.
.venv/bin/ruff check .
.venv/bin/mypy
# The user guide (mkdocs.yml over docs/) with every warning an error: a link to a missing
# page or heading, or a page left out of the nav, fails the run. Built into a temporary
# directory, never the tree. No --quiet: it hides the warnings from the count --strict fails on
# (a broken link passed with it).
site=$(mktemp -d /tmp/zbak-site.XXXXXX)
.venv/bin/mkdocs build --strict --site-dir "$site" || { rm -rf "$site"; exit 1; }
rm -rf "$site"
# The image of the OpenZFS 2.3 guest for the `openzfs` tier, built before pytest so a cold
# build (~5 min, then cached in /var/cache/zfsvm) never runs inside a test timeout.
./scripts/openzfs-vm.sh build
export ZBAK_TEST_STRICT=1
if [ "$#" -gt 0 ]; then
  exec .venv/bin/pytest "$@"
fi
# The whole suite as two pytest sessions at once (docs/decisions.md#the-openzfs-tier-runs-beside-the-rest):
# the `openzfs` tier spends its time in the guest's emulated CPU, one host core, while the
# rest waits on zfs-fuse, sshd and S3 as much as it computes. Each session has its own
# zfs-fuse, sshd, S3 server and PostgreSQL; the guest is shared by design. The tier's output
# follows the rest's; either failing fails the run.
openzfs_log=$(mktemp /tmp/zbak-openzfs-tier.XXXXXX)
.venv/bin/pytest -m openzfs >"$openzfs_log" 2>&1 &
openzfs_pid=$!
status=0
.venv/bin/pytest -m "not openzfs" || status=$?
openzfs_status=0
wait "$openzfs_pid" || openzfs_status=$?
echo "===== the openzfs tier (pytest -m openzfs, run beside the rest) ====="
cat "$openzfs_log"
rm -f "$openzfs_log"
if [ "$status" -eq 0 ]; then status=$openzfs_status; fi
exit "$status"
