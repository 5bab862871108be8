"""``vcasync coordinator``'s status page options: the read token from the environment or a file, told
apart from every other credential, and all of it in ``--help``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vcasync.cli import main

MODEL = ["coordinator", "--model", "vcasync.examples.digits:model"]
JOIN = "join-secret-for-cli-tests-0e4f"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VCASYNC_JOIN_SECRET", JOIN)
    for name in ("VCASYNC_JOIN_TOKENS", "VCASYNC_OPERATOR_TOKEN", "VCASYNC_STATUS_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def test_help_names_the_read_token_its_variable_and_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["coordinator", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for needle in ("VCASYNC_STATUS_TOKEN", "--status-token-file", "--status-no-loopback", "/status/"):
        assert needle in out


@pytest.mark.parametrize("same_as", ["VCASYNC_JOIN_SECRET", "VCASYNC_OPERATOR_TOKEN"])
def test_the_read_token_must_be_a_credential_of_its_own(monkeypatch: pytest.MonkeyPatch, same_as: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VCASYNC_OPERATOR_TOKEN", "operator-token-for-cli-tests-77")
    monkeypatch.setenv("VCASYNC_STATUS_TOKEN", os.environ[same_as])
    assert main(MODEL) == 2
    err = capsys.readouterr().err
    assert "status read token must differ" in err
    assert os.environ[same_as] not in err


def test_a_short_read_token_from_a_file_is_refused(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "token").write_text("short\n")
    assert main([*MODEL, "--status-token-file", str(tmp_path / "token")]) == 2
    assert "status read token is too short" in capsys.readouterr().err


def test_distrusting_loopback_needs_a_read_token(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*MODEL, "--status-no-loopback"]) == 2
    assert "--status-no-loopback needs a status read token" in capsys.readouterr().err
