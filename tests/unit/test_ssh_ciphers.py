"""Which ciphers the ``ssh`` binary is asked for (``proc.openssh.data_ciphers``), and their config."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from zrepl_py.config.hosts import HostConfig
from zrepl_py.proc import openssh
from zrepl_py.proc.openssh import AES_GCM_FIRST, cpu_has_aes, data_ciphers, ssh_argv

X86 = "processor\t: 0\nflags\t\t: fpu vme sse2 pclmulqdq aes avx2 sha_ni vaes\n\n"
X86_NO_AES = "processor\t: 0\nflags\t\t: fpu vme sse2 avx2 vaes_extra aesni_like\n\n"
ARM64 = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32\n"
ARM64_NO_CRYPTO = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"


@pytest.mark.parametrize(("text", "expected"), [
    (X86, True), (X86_NO_AES, False), (ARM64, True), (ARM64_NO_CRYPTO, False), ("", False),
    ("model name\t: aes special edition\n", False),
])  # fmt: skip
def test_cpu_has_aes_reads_only_the_aes_flag_of_the_flag_lines(text, expected):
    assert cpu_has_aes(text) is expected


def ciphers_option(argv: list[str]) -> str | None:
    options = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]
    found = [o.split("=", 1)[1] for o in options if o.startswith("Ciphers=")]
    assert len(found) <= 1
    return found[0] if found else None


@pytest.mark.parametrize("aes", [True, False])
def test_by_default_aes_gcm_comes_first_only_on_a_cpu_with_aes(monkeypatch, aes):
    # Both answers of the CPU's flag on one machine (docs/reliability.md#in-process-hooks-kept).
    monkeypatch.setattr(openssh, "_local_cpu_has_aes", lambda: aes)
    host = HostConfig(address="h")
    argv = ssh_argv(host, known_hosts_default=Path("/kh"))
    if aes:
        assert data_ciphers(host) == list(AES_GCM_FIRST)
        assert ciphers_option(argv) == ",".join(AES_GCM_FIRST)
    else:
        assert data_ciphers(host) == []
        assert ciphers_option(argv) is None
    assert argv[-2:] == ["--", "h"]


def test_default_list_keeps_every_default_openssh_cipher_after_aes_gcm():
    # OpenSSH 6.9+ client default (ssh_config(5) Ciphers): the same set, reordered.
    defaults = {"chacha20-poly1305@openssh.com", "aes128-ctr", "aes192-ctr", "aes256-ctr",
                "aes128-gcm@openssh.com", "aes256-gcm@openssh.com"}
    assert set(AES_GCM_FIRST) == defaults and len(AES_GCM_FIRST) == len(defaults)
    assert AES_GCM_FIRST[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


@pytest.mark.parametrize("aes", [True, False])
def test_configured_ciphers_win_and_an_empty_list_leaves_ssh_its_order(monkeypatch, aes):
    # As above: the CPU's AES flag, both ways (docs/reliability.md#in-process-hooks-kept).
    monkeypatch.setattr(openssh, "_local_cpu_has_aes", lambda: aes)
    mine = HostConfig(address="h", ciphers=["chacha20-poly1305@openssh.com", "aes256-ctr"])
    assert ciphers_option(ssh_argv(mine, known_hosts_default=Path("/kh"))) == \
        "chacha20-poly1305@openssh.com,aes256-ctr"
    none = HostConfig(address="h", ciphers=[])
    assert ciphers_option(ssh_argv(none, known_hosts_default=Path("/kh"))) is None


@pytest.mark.parametrize("bad", [
    ["aes128-ctr,3des-cbc"], ["aes128-ctr -oProxyCommand=x"], ["-oProxyCommand=x"], [""],
    ["AES128-CTR"], ["aes128-ctr", "aes128-ctr"],
])  # fmt: skip
def test_a_cipher_that_is_not_one_plain_name_is_refused_by_the_config(bad):
    with pytest.raises(ValidationError, match="cipher"):
        HostConfig(address="h", ciphers=bad)
