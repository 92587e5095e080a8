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
# The image of the OpenZFS 2.3 guest for the `openzfs` tier, built before pytest so a cold
# build (~5 min, then cached in /var/cache/zfsvm) never runs inside a test timeout.
./scripts/openzfs-vm.sh build
export ZBAK_TEST_STRICT=1
exec .venv/bin/pytest "$@"
