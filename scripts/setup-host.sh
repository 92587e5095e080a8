#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian bookworm machine (as root) for zbak's demo and tests:
# Debian packages, the virtualenv with zbak in editable mode and every extra (s3, postgresql,
# docs, test), and a running zfs-fuse daemon.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(zfs-fuse openssh-server openssh-client rsync zstd age pv mbuffer postgresql python3-venv python3-pip procps strace man-db podman runc netavark aardvark-dns iptables debootstrap tmux prometheus systemd)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  # Debian's postinst scripts try to start services; the test bed starts its own instances.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's python3 (the python3-venv above), not the first python3 on PATH: a pyenv build
# without PGO/LTO took 0.80 CPU s against 0.67 to import what `zbak archive` needs.
python=${PYTHON:-/usr/bin/python3}
stamp=.venv/.zbak-installed
want="$(sha256sum setup.cfg | cut -d' ' -f1) $(readlink -f "$(command -v "$python")")"
if [[ ! -x .venv/bin/python || "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  rm -rf .venv  # another interpreter's venv is not upgraded in place
  echo "setup: creating .venv and installing zbak (editable) with all extras"
  "$python" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[all,docs,test]'
  echo "$want" > "$stamp"
fi

# The SFTP-only user of the test bed's chrooted SFTP server (tests/support/sftpd.py): no home,
# no shell, password field '*' (no password, yet not locked: sshd without PAM refuses a locked
# account).
if ! getent passwd zbak-sftp >/dev/null; then
  echo "setup: creating the SFTP-only test user zbak-sftp"
  useradd --system --no-create-home --home-dir / --shell /usr/sbin/nologin --password '*' zbak-sftp
fi

# Asked by its socket, not pgrep: a zfs-fuse of a benchmark's private mount namespace
# shows in pgrep but does not serve this namespace.
if ! zpool list >/dev/null 2>&1; then
  echo "setup: starting zfs-fuse"
  /usr/sbin/zfs-fuse
fi
for _ in $(seq 1 50); do
  zpool list >/dev/null 2>&1 && exit 0
  sleep 0.2
done
echo "setup: zfs-fuse did not answer 'zpool list' within 10 s" >&2
exit 1
