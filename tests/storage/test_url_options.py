"""A storage URL's query options: an unknown one is named, and the list offered in its place holds
only what a URL may carry (found by a new-user probe: it listed aws_secret_access_key and
aws_session_token, which a URL is always refused)."""

from __future__ import annotations

import pytest

from backends._common import parse_options
from backends.s3 import S3Options
from vcasync.errors import ConfigError
from vcasync.storage import open_storage


def test_an_unknown_url_option_lists_only_what_a_url_may_carry() -> None:
    with pytest.raises(ConfigError) as info:
        parse_options(S3Options, "s3://b/p?regoin=x", "regoin=x", {})
    said = str(info.value)
    assert "unknown option(s) regoin for 's3://b/p?regoin=***'; a URL may carry: " in said
    assert "endpoint_url" in said
    for secret in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token"):
        assert secret not in said
    assert "credentials go as keyword arguments or the standard credential chain" in said


def test_an_unknown_keyword_option_lists_every_option() -> None:
    with pytest.raises(ConfigError, match=r"unknown option\(s\) regoin for 's3://b/p'; known: .*"
                                          r"aws_secret_access_key"):
        parse_options(S3Options, "s3://b/p", "", {"regoin": "x"})


def test_a_secret_in_the_url_is_still_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="option 'aws_session_token' is a secret"):
        parse_options(S3Options, "s3://b/p?aws_session_token=t", "aws_session_token=t", {})


@pytest.mark.parametrize("url", [
    "s3://b/p?aws_secret_access_key=SECRET123&bogus=1",            # unknown option beside a secret
    "s3://b/p?aws_secret_access_key=SECRET123&aws_secret_access_key=SECRET123",   # given twice
    "s3://b/p?region=eu&aws_session_token=SECRET123#SECRET123",    # a fragment
    "gs://b/p?emulator_host=http://u:SECRET123@h&nope=1",          # a password inside a value
    "file://u:SECRET123@host/tmp/x",                               # user info
])
def test_a_refused_storage_url_never_shows_a_secret_it_carries(url: str) -> None:
    # the message that refuses a URL ends up in logs: option names stay, every value is masked
    with pytest.raises(ConfigError) as err:
        open_storage(url)
    assert "SECRET123" not in str(err.value)
    assert "***" in str(err.value)
