"""Config loading: examples parse, bad configs name the key path and the file (exit 2)."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest

from zrepl_py.cli import main
from zrepl_py.config.hosts import LOCAL_HOST, parse_endpoint
from zrepl_py.config.loading import config_path, load_config, parse_config
from zrepl_py.errors import ConfigError, ExitStatus
from zrepl_py.stores.schemes.file import FileStoreConfig
from zrepl_py.stores.schemes.s3 import S3StoreConfig
from zrepl_py.stores.settings import StoreConfig
from zrepl_py.values.units import parse_duration, parse_size

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
INVALID = sorted((ROOT / "tests/data/configs/invalid").glob("*.toml"))


def expected_key(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path} must start with '# expect: KEY'"
    return first.removeprefix("# expect: ")


def test_there_is_one_example_per_use():
    """docs/reliability.md#r44-sample-configs."""
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_parses_into_a_validated_config(path):
    """docs/reliability.md#r44-sample-configs."""
    config = load_config(path)
    assert config.jobs


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_every_invalid_config_fails_naming_its_key_path_and_file(path):
    """docs/reliability.md#r44-sample-configs."""
    with pytest.raises(ConfigError) as info:
        load_config(path)
    keys = [key or "<file>" for key, _ in info.value.problems]
    assert expected_key(path) in keys
    assert str(path) in str(info.value)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_the_cli_exits_2_on_an_invalid_config_and_names_key_and_file(path, capsys):
    """docs/reliability.md#r44-sample-configs."""
    assert main(["--config", str(path), "config", "check"], env={}) == ExitStatus.USAGE
    err = capsys.readouterr().err
    assert str(path) in err and expected_key(path) in err


def test_config_check_exits_2_as_a_subprocess_too():
    """docs/reliability.md#r44-sample-configs."""
    bad = INVALID[0]
    proc = subprocess.run([sys.executable, "-m", "zrepl_py", "--config", str(bad), "config", "check"],
                          capture_output=True, text=True)
    assert proc.returncode == ExitStatus.USAGE
    assert expected_key(bad) in proc.stderr


def test_a_missing_config_file_is_a_usage_error_naming_the_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="nope.toml"):
        load_config(missing)


def test_config_path_prefers_the_option_then_the_environment_then_etc():
    assert config_path("a.toml", {"ZBAK_CONFIG": "b.toml"}) == Path("a.toml")
    assert config_path(None, {"ZBAK_CONFIG": "b.toml"}) == Path("b.toml")
    assert config_path(None, {}) == Path("/etc/zbak/zbak.toml")


def test_defaults_fill_in_a_minimal_config():
    config = parse_config({"jobs": {"a": {"dataset": "tank/a"}}}, "x.toml")
    job = config.jobs["a"]
    assert job.source.host == LOCAL_HOST and job.source.dataset == "tank/a"
    assert job.snapshot.prefix == "zbak" and job.snapshot.retention.keep_last == 3
    assert config.catalog_url == "sqlite:////var/lib/zbak/catalog.sqlite"


@pytest.mark.parametrize(
    "text, host, dataset, directory",
    [
        ("tank/a", "local", "tank/a", None),
        ("backup:pool/a b:c", "backup", "pool/a b:c", None),
        ("nas:/srv/zbak/", "nas", None, "/srv/zbak"),
        ("local:p:x/y", "local", "p:x/y", None),
    ],
)
def test_endpoints_parse_host_and_dataset_or_directory(text, host, dataset, directory):
    endpoint = parse_endpoint(text, allow_directory=True)
    assert (endpoint.host, endpoint.dataset, endpoint.directory) == (host, dataset, directory)


@pytest.mark.parametrize(
    "text, seconds",
    [(90, 90), ("90m", 5400), ("36h", 129600), ("30d", 2592000), ("2w", 1209600), ("1y", 31536000)],
)
def test_durations_accept_seconds_and_unit_suffixes(text, seconds):
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text, size",
    [(512, 512), ("1K", 1000), ("1KiB", 1024), ("1.5G", 1_500_000_000), ("1GiB", 2**30), ("2TiB", 2 * 2**40)],
)
def test_sizes_accept_si_and_iec_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["-1", "ten", True, "5x", -5])
def test_bad_sizes_are_rejected(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_secrets_have_no_config_key_that_takes_them_inline():
    # S3 credentials come from the AWS chain only: a key in [stores] is an unknown key.
    with pytest.raises(ConfigError) as info:
        parse_config({"stores": {"s": {"url": "s3://bucket-a", "secret_access_key": "x"}}}, "x.toml")
    assert ("stores.s.secret_access_key", "unknown key") in info.value.problems


def _targets_problems(dataset: str, targets: list[str], recursive: bool) -> list[str]:
    config = parse_config({"hosts": {"nas": {"address": "nas.example.net"}},
                           "jobs": {"a": {"dataset": dataset, "recursive": recursive,
                                          "replicate": {"targets": targets}}}}, "zbak.toml")
    return [key for key, _ in config.reference_problems()]


@pytest.mark.parametrize(("dataset", "target", "recursive"), [
    ("tank/data", "nas:tank/data/backup", True),
    ("tank/data", "nas:tank/data", False),
    ("nas:tank/data", "tank/data/backup", True),
    ("tank/data", "tank/data2", True),
    ("tank/data", "tank/data/backup", False),
    ("tank/data", "tank", True),
])
def test_a_target_outside_its_source_tree_on_that_host_is_accepted(dataset, target, recursive):
    """docs/decisions.md#a-target-inside-its-own-source-tree-is-refused: only the same host's own
    tree is refused (a non-recursive source does not snapshot its children)."""
    assert _targets_problems(dataset, [target], recursive) == []


@pytest.mark.parametrize(("dataset", "target", "recursive"), [
    ("tank/data", "local:tank/data/backup", True),
    ("local:tank/data", "tank/data/a/b", True),
    ("tank/data", "tank/data", False),
    ("nas:tank/data", "nas:tank/data", True),
])
def test_a_target_inside_its_source_tree_on_the_same_host_is_refused(dataset, target, recursive):
    """docs/decisions.md#a-target-inside-its-own-source-tree-is-refused (``local`` written or not;
    see also tests/data/configs/invalid)."""
    with pytest.raises(ConfigError) as info:
        _targets_problems(dataset, [target], recursive)
    assert [key for key, _ in info.value.problems] == ["jobs.a.replicate.targets[0]"]


@pytest.mark.parametrize("data, key, message", [
    ({"jobs": {"j": {"dataset": "p/d", "select": "x"}}}, "jobs.j.select",
     "expected a table, got a string"),
    ({"jobs": {"j": {"dataset": 5}}}, "jobs.j.dataset", "expected a string, got an integer"),
    ({"jobs": {"j": {"dataset": "p/d", "recursive": "yes"}}}, "jobs.j.recursive",
     "expected true or false, got a string"),
    ({"jobs": {"j": {"dataset": "p/d", "replicate": {"targets": "p/x"}}}},
     "jobs.j.replicate.targets", "expected an array, got a string"),
    ({"jobs": []}, "jobs", "expected a table, got an array"),
])
def test_a_value_of_the_wrong_type_is_named_in_tomls_words(data, key, message):
    """docs/decisions.md#cli-frictions-a-first-time-admin-met: pydantic says 'Input should be a
    valid dictionary or instance of SelectConfig'; an admin wrote TOML, so the message says table,
    array, string. The value found is never shown: it may be a secret (test_alerts_apprise)."""
    with pytest.raises(ConfigError) as info:
        parse_config(data, "zbak.toml")
    assert info.value.problems == [(key, message)]


S3_ONLY = sorted(set(S3StoreConfig.model_fields) - set(StoreConfig.model_fields))
"""The keys of ``[stores.NAME]`` only an ``s3://`` store takes."""


@pytest.mark.parametrize("key", S3_ONLY)
def test_an_s3_key_on_a_file_store_is_refused_naming_the_key_and_the_scheme_it_belongs_to(key):
    """Each scheme's table takes its own keys (stores.registry): an S3 setting on a
    ``file://`` store would silently do nothing (``encryption`` that encrypts nothing), so
    it is an error at its own key path."""
    value = {"sse": "AES256"} if key == "encryption" else "x"
    with pytest.raises(ConfigError) as info:
        parse_config({"stores": {"local": {"url": "file:///srv/zbak", key: value}}}, "zbak.toml")
    assert info.value.problems == [(f"stores.local.{key}", f"{key} applies to s3:// stores only")]


@pytest.mark.parametrize("store, problems", [
    ({"url": "s3://my-bucket/x", "bogus": 1}, [("stores.s.bogus", "unknown key")]),
    ({"url": "file:///srv/zbak", "bogus": 1}, [("stores.s.bogus", "unknown key")]),
    ({"url": "s3://my-bucket/x", "upload_concurrency": 0},
     [("stores.s.upload_concurrency", "Input should be greater than or equal to 1")]),
    ({"url": "ftp://example.net/x", "endpoint": "http://h", "bogus": 1},
     [("stores.s.url", "expected 's3://bucket[/prefix]', 'file:///absolute/dir' or"
                       " 'sftp://host/absolute/dir'"),
      ("stores.s.bogus", "unknown key")]),
    ({"url": "sftp://local/srv/zbak"},
     [("stores.s.url", "sftp://local/... names this machine: use 'file:///absolute/dir'")]),
    ({"url": "s3://B_AD"}, [("stores.s.url", "expected 's3://bucket[/prefix]'")]),
    ({"url": "sftp://box/srv/zbak"}, [("stores.s.url", "host 'box' is not defined under [hosts]")]),
    ({"endpoint": "http://h"}, [("stores.s.url", "Field required")]),
    ({"url": 5}, [("stores.s.url", "expected a string, got an integer")]),
    ("file:///srv/zbak", [("stores.s", "expected a table, got a string")]),
])
def test_a_store_tables_problems_name_the_key_as_written_whatever_its_scheme(store, problems):
    """A store's table is validated as its scheme's settings; the key paths are the ones
    the admin wrote (no scheme in between), an unrecognised URL is the one problem besides
    the keys no scheme takes."""
    with pytest.raises(ConfigError) as info:
        parse_config({"stores": {"s": store}}, "zbak.toml")
    assert info.value.problems == problems


def test_each_store_table_becomes_its_schemes_settings():
    config = parse_config({"stores": {
        "cold": {"url": "s3://my-bucket/zbak", "region": "eu-central-1", "volume_size": "2GiB"},
        "local": {"url": "file:///srv/zbak", "storage_class": {"full": "GLACIER"}},
    }}, "zbak.toml")
    cold, local = config.stores["cold"], config.stores["local"]
    assert isinstance(cold, S3StoreConfig) and isinstance(local, FileStoreConfig)
    assert (cold.bucket, cold.prefix, cold.region, cold.volume_size) == (
        "my-bucket", "zbak", "eu-central-1", 2 * 1024**3)
    assert (local.directory, local.storage_class.full) == (Path("/srv/zbak"), "GLACIER")
