"""What ships for deployment is consistent: docker/ (image, compose, MinIO set-up), the systemd
unit, the zfs allow script and the authorized_keys example.

Docker itself cannot run on the test bed (a client without a daemon or compose plugin), so
the compose file is checked with a YAML parser (PyYAML, installed with moto[server]) for the
wiring the README promises; the unit file is checked by ``systemd-analyze verify``; shell
scripts by ``sh -n`` and by running the zfs allow script in print-only mode.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.common import need_binary

from zrepl_py.config.loading import load_config

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
EXAMPLES = ROOT / "examples"
ZBAK = Path(sys.executable).with_name("zbak")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def test_compose_runs_the_zbak_daemon_after_minio_is_healthy_and_the_bucket_and_catalog_exist(compose):
    services = compose["services"]
    assert set(services) == {"minio", "minio-init", "zbak-init", "zbak"}
    assert services["zbak"]["command"] == ["daemon"]
    assert services["zbak-init"]["command"][0] == "init"
    assert services["minio-init"]["depends_on"] == {"minio": {"condition": "service_healthy"}}
    assert services["zbak-init"]["depends_on"] == {
        "minio-init": {"condition": "service_completed_successfully"}}
    assert services["zbak"]["depends_on"] == {
        "zbak-init": {"condition": "service_completed_successfully"}}
    assert services["minio"]["healthcheck"]["test"][:2] == ["CMD", "mc"]


def test_compose_builds_the_image_from_docker_dockerfile_in_the_repository(compose):
    for name in ("zbak", "zbak-init"):
        build = compose["services"][name]["build"]
        assert (DOCKER / build["context"]).resolve() == ROOT
        assert (ROOT / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"


def test_every_file_compose_mounts_ships_except_the_users_ssh_keys(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./") and source != "./ssh":
                assert (DOCKER / source).is_file(), f"{name} mounts missing {source}"


def test_no_secret_is_written_in_the_compose_file(compose):
    for name, service in compose["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET|ACCESS_KEY|ROOT_USER", key):
                assert str(value).startswith("${"), f"{name}.{key} must come from .env"
    keys = {line.split("=", 1)[0] for line in (DOCKER / "env.example").read_text().splitlines()
            if line and not line.startswith("#")}
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", (DOCKER / "docker-compose.yml").read_text()))
    assert used <= keys, f"env.example lacks {used - keys}"


def test_the_bucket_created_by_minio_init_is_the_store_of_the_docker_config(compose):
    config = load_config(DOCKER / "zbak.toml")
    (store,) = config.stores.values()
    bucket = store.url.removeprefix("s3://").split("/", 1)[0]
    assert f"local/{bucket}" in (DOCKER / "minio-init.sh").read_text()
    policy = json.loads((DOCKER / "minio-zbak-policy.json").read_text())
    resources = {r for statement in policy["Statement"] for r in statement["Resource"]}
    assert resources == {f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"}
    assert store.endpoint.split("//", 1)[1].split(":", 1)[0] in compose["services"]


def test_the_metrics_port_of_the_docker_config_is_published_on_loopback(compose):
    config = load_config(DOCKER / "zbak.toml")
    _, port = config.metrics.listen_address()
    assert f"127.0.0.1:{port}:{port}" in compose["services"]["zbak"]["ports"]


def test_the_image_is_debian_bookworm_slim_without_zfs_userland_and_runs_zbak_daemon():
    text = (DOCKER / "Dockerfile").read_text()
    assert "ARG DEBIAN=debian:bookworm-slim" in text
    assert not re.search(r"apt-get install[^\n]*(zfsutils|zfs-fuse)", text)
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "zbak"]' in text
    assert 'CMD ["daemon"]' in text
    for source in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE):
        for path in source.split():
            assert (ROOT / path).exists(), f"COPY of missing {path}"
    kept = (DOCKER / "Dockerfile.dockerignore").read_text()
    for path in ("setup.cfg", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE",
                 "zrepl_py", "migrations", "examples"):
        assert f"!{path}" in kept


def test_the_shell_scripts_parse():
    for script in (DOCKER / "minio-init.sh", EXAMPLES / "zfs-allow.sh"):
        done = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr


TARGET = ("receive,create,mount,hold,release,userprop,canmount,readonly,compression,recordsize,"
          "atime,relatime,xattr,acltype,aclinherit,aclmode,dnodesize,checksum,copies,sync,"
          "logbias,primarycache,secondarycache,snapdir,redundant_metadata,special_small_blocks,"
          "volmode")
"""Receive, plus zbak's default replica properties and those a faithful replica receives;
never mountpoint, sharenfs, sharesmb, refreservation
(docs/decisions.md#replica-properties-keep-a-failover-replica-faithful)."""


@pytest.mark.parametrize("args, perms", [
    (["source", "zbak", "tank/data"],
     "send,snapshot,hold,release,bookmark,destroy,mount,userprop"),
    (["target", "zbak", "backup/replicas"], TARGET),
    (["target", "zbak", "backup/replicas", "--rollback"], TARGET + ",rollback,destroy"),
])
def test_the_zfs_allow_script_grants_the_documented_sets(args, perms):
    """docs/reliability.md#r37-delegation-only."""
    done = subprocess.run(["sh", str(EXAMPLES / "zfs-allow.sh"), "-n", *args],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["zfs", "allow", "-u", args[1], perms, args[2]]


def test_the_target_set_never_lets_a_stream_mount_share_or_reserve_on_the_backup_host():
    """docs/decisions.md#replica-properties-keep-a-failover-replica-faithful: without these
    permissions no received property can take effect, whatever ``zfs receive -x`` does
    (openzfs/zfs#17240)."""
    done = subprocess.run(["sh", str(EXAMPLES / "zfs-allow.sh"), "-n", "target", "u", "b/r",
                           "--rollback"], capture_output=True, text=True, check=True)
    granted = done.stdout.split()[4].split(",")
    for forbidden in ("mountpoint", "sharenfs", "sharesmb", "refreservation", "reservation",
                      "exec", "setuid", "devices"):
        assert forbidden not in granted


def test_the_zfs_allow_script_refuses_an_unknown_role():
    """docs/reliability.md#r37-delegation-only."""
    done = subprocess.run(["sh", str(EXAMPLES / "zfs-allow.sh"), "-n", "both", "u", "t/d"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "usage" in done.stderr


def test_the_systemd_unit_is_valid_and_hardened_but_leaves_zfs_usable(tmp_path):
    text = (EXAMPLES / "zbak.service").read_text()
    for line in ("Type=simple", "ProtectSystem=strict", "ReadWritePaths=/var/lib/zbak",
                 "NoNewPrivileges=yes", "DeviceAllow=/dev/zfs rw", "KillSignal=SIGTERM"):
        assert f"\n{line}\n" in text
    assert "\nPrivateDevices=yes" not in text, "it would hide /dev/zfs"
    analyze = need_binary("systemd", "systemd-analyze")  # Debian systemd (setup-host.sh)
    unit = tmp_path / "zbak.service"
    unit.write_text(text.replace("/usr/local/bin/zbak", str(ZBAK)))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def _forced_commands() -> list[tuple[str, str]]:
    lines = [line for line in (EXAMPLES / "authorized_keys.example").read_text().splitlines()
             if line and not line.startswith("#")]
    found = []
    for line in lines:
        match = re.match(r'command="([^"]+)",((?:[a-z-]+(?:="[^"]*")?,?)+) ssh-ed25519 ', line)
        assert match, line
        found.append((match.group(1), match.group(2)))
    return found


def test_the_authorized_keys_example_forces_zbak_serve_with_restrict_on_every_key():
    commands = _forced_commands()
    assert len(commands) == 2
    for command, options in commands:
        assert "restrict" in options.split(",")
        assert shlex.split(command)[1:3] == ["serve", "--root"]


@pytest.mark.parametrize("index", [0, 1])
def test_the_forced_commands_of_the_example_parse_and_refuse_a_shell(tmp_path, index):
    """docs/reliability.md#r36-forced-command."""
    command, _ = _forced_commands()[index]
    argv = shlex.split(command)
    argv[0] = str(ZBAK)
    argv = [a for a in argv if not a.startswith("/var/log/")]
    if "--log" in argv:
        argv.remove("--log")
    done = subprocess.run([*argv, "--log", str(tmp_path / "log")], capture_output=True,
                          text=True, env={"SSH_ORIGINAL_COMMAND": "sh -c id", "PATH": "/bin"})
    assert done.returncode == 126, done.stderr
    assert "program 'sh' is not allowed" in (tmp_path / "log").read_text()
