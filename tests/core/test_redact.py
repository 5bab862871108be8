"""Secrets taken out of failure text (vcasync._redact), and the coordinator's own scrubbing by digest
(TokenAuthority.scrub): what each finds, and what it leaves as it was."""

from __future__ import annotations

from vcasync._redact import (
    MASK,
    Redactor,
    bounded,
    env_secrets,
    mask_spans,
    option_secrets,
    url_secrets,
)
from vcasync.server._auth import TokenAuthority

SECRET = "join-secret-0123456789"
TOKEN = "vca_0123456789abcdef_AbCdEf-ghIJ_klmnopQRSTuvwxyz0123456789abcd"


def test_known_secrets_and_worker_tokens_are_masked_everywhere() -> None:
    redact = Redactor([SECRET, None, "", "abc"])          # too short, or none: not looked for
    text = f"a {SECRET}{SECRET} b {TOKEN}, abc {TOKEN.replace('0123', '9999')}"
    assert redact(text) == f"a {MASK} b {MASK}, abc {MASK}"
    assert redact("nothing here") == "nothing here"
    assert SECRET not in repr(redact)


def test_overlapping_spans_become_one_mask() -> None:
    assert mask_spans("0123456789", [(2, 5), (4, 7), (8, 9)]) == f"01{MASK}7{MASK}9"
    redact = Redactor(["secretsecret", "tsec"])
    assert redact("x secretsecret y") == f"x {MASK} y"


def test_storage_url_and_option_credentials() -> None:
    found = url_secrets("s3://AKIAEXAMPLE:pa%2Fss@bucket/prefix?aws_secret_access_key=s3cr3tkey&region=eu")
    assert {"AKIAEXAMPLE", "pa%2Fss", "pa/ss", "s3cr3tkey", "eu"} <= set(found)
    assert url_secrets("/a/local/path") == []
    assert url_secrets("http://[::1") == []                 # does not parse: nothing, no error
    assert option_secrets({"aws_secret_access_key": "k3y", "region": "eu", "timeout": 3}) == ["k3y"]
    assert env_secrets({"HF_TOKEN": "hf_abcdefgh", "AWS_SECRET_ACCESS_KEY": "x" * 20,
                        "HOME": "/root/secret-dir", "SHORT_TOKEN": "abc"}) == ["hf_abcdefgh", "x" * 20]


def test_bounded() -> None:
    assert bounded("abc", 3) == "abc"
    assert bounded("abcdef", 5) == "ab..."


def test_the_authority_scrubs_by_digest_what_it_keeps_no_copy_of() -> None:
    auth = TokenAuthority(join_secret=SECRET, join_tokens={"w1": "join-token-w1-abcdef0123"},
                          operator_token="operator-token-0123456789")
    assert auth.revoke_join_token("w1")                    # revoked: still never shown
    text = (f"s={SECRET}, t=join-token-w1-abcdef0123, o=operator-token-0123456789, w={TOKEN}, "
            f"near={SECRET[:-1]}")
    assert auth.scrub(text) == f"s={MASK}, t={MASK}, o={MASK}, w={MASK}, near={SECRET[:-1]}"
    assert auth.scrub("") == ""
    assert SECRET not in repr(vars(auth))                   # digests only, as before


def test_credentials_by_their_shape_are_masked_at_both_ends() -> None:
    # Found by a probe: a trainer's message with credentials in a URL it was not given as --state,
    # or a bearer header it printed, reached the coordinator's log, status and stored ledger
    text = ("GET s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/x failed; https://user:pa55w0rd@host/p; "
            "Authorization: Bearer abcdefgh12345678; plain http://host/path and user@example.org")
    want = (f"GET s3://{MASK}@bucket/x failed; https://{MASK}@host/p; Authorization: Bearer {MASK}; "
            "plain http://host/path and user@example.org")
    assert Redactor()(text) == want
    assert TokenAuthority(join_secret=SECRET).scrub(text) == want
