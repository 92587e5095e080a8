"""Reading `zfs send -nvt TOKEN` output: real OpenZFS 2.3.2 captures in tests/data/resume/."""

from __future__ import annotations

from pathlib import Path

import pytest

from zrepl_py.errors import ResumeTokenInvalid
from zrepl_py.zfs.resume import ResumeToken, check_token, parse_token_description

DATA = Path(__file__).resolve().parent.parent / "data" / "resume"


def capture(name: str) -> tuple[str, str]:
    """(output, token) of one captured case."""
    return (DATA / f"{name}.txt").read_text(), (DATA / f"{name}.token").read_text().strip()


# (case, toname, toguid, fromguid, raw, compressed, bytes) as listed in tests/data/resume/README.md
CASES = [
    ("full", "src/plain@s1", 10780098838328379773, None, False, False, 0x8C8),
    ("incremental_compressed", "src/data@b", 7856619511955468987, 11337000393154678316,
     False, True, 0x218C8),
    ("raw_encrypted", "src/enc@e1", 10494866564140347483, None, True, True, 0xE94),
    ("incremental_from_bookmark", "src/plain@s2", 16645683954185531000, 10780098838328379773,
     False, False, 0x1818),
    ("stale", "src/data@b", 7856619511955468987, 11337000393154678316, False, True, 0x218C8),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_real_token_descriptions_parse_to_the_guids_zfs_reported(case):
    name, toname, toguid, fromguid, raw, compressed, size = case
    text, tok = capture(name)
    parsed = parse_token_description(text, tok)
    assert parsed == ResumeToken(token=tok, toguid=toguid, toname=toname, fromguid=fromguid,
                                 raw=raw, compressed=compressed, bytes=size)
    assert parsed.dataset == toname.split("@")[0]
    assert parsed.incremental is (fromguid is not None)


def test_decimal_numbers_and_bare_flags_are_read_too():
    text = ("resume token contents:\nnvlist version: 0\n\tfromguid = 12\n\tobject = 2\n"
            "\toffset = 0\n\tbytes = 4096\n\ttoguid = 18446744073709551615\n"
            "\ttoname = pool/a b:c@s 1\n\trawok\n\tcompressok = 0\n"
            "full send of pool/a b:c@s 1 estimated size is 1M\n")
    parsed = parse_token_description(text, "1-0-0-00")
    assert (parsed.fromguid, parsed.toguid, parsed.bytes) == (12, 2**64 - 1, 4096)
    assert parsed.toname == "pool/a b:c@s 1" and parsed.dataset == "pool/a b:c"
    assert parsed.raw and not parsed.compressed


def test_the_contents_are_found_after_other_output():
    text, tok = capture("full")
    noisy = "some warning\n" + text
    assert parse_token_description(noisy, tok).toname == "src/plain@s1"


@pytest.mark.parametrize("text", [
    "",
    "cannot resume send: resume token is corrupt (invalid format)\n",
    "resume token contents:\nnvlist version: 0\n\tobject = 0x2\n",  # no toguid/toname
    "resume token contents:\n\ttoguid = zz\n\ttoname = p/d@s\n",
    "resume token contents:\n\ttoguid = 0x1ffffffffffffffff\n\ttoname = p/d@s\n",
    "resume token contents:\n\ttoguid = 0x5\n\ttoname = p/d@-bad\n",
    "resume token contents:\n\ttoguid = 0x5\n\ttoname = p/d\n",
])
def test_unreadable_descriptions_raise_resume_token_invalid(text):
    with pytest.raises(ResumeTokenInvalid):
        parse_token_description(text, "1-0-0-00")


@pytest.mark.parametrize("token", [
    "", "-", "1-garbage", "-t", "1-abc-12-789c; rm -rf /", "1-ABC-12-789C", "1-abc-12",
    " 1-abc-12-789c", "1-abc-12-789c\n",
])
def test_malformed_tokens_are_refused_before_any_command(token):
    with pytest.raises(ResumeTokenInvalid):
        check_token(token)


def test_every_captured_token_has_the_documented_shape():
    for path in DATA.glob("*.token"):
        token = path.read_text().strip()
        assert check_token(token) == token
