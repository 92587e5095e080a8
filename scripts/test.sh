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
# The whole suite on four xdist workers (docs/decisions.md#the-suite-runs-on-xdist-workers): most
# tests wait on zfs-fuse, sshd, S3, PostgreSQL and the OpenZFS guest's emulated CPU far more
# than they compute. Each worker has its own zfs-fuse (own mount namespace), sshd, S3 server
# and PostgreSQL; the guest's tests all run on one worker, first (tests/support/distribution.py).
exec .venv/bin/pytest -n 4 --dist loadfile --no-loadscope-reorder --durations=30
