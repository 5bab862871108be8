"""Messages the troubleshooting table of docs/operating.md quotes, held to the messages the code
really gives: an operator greps a log for the quoted text, and the table quoted `the join secret is
too short` while every command said `the join secret (VCASYNC_JOIN_SECRET) is too short`.

Each case makes the real error (no server, no process: the functions the commands call) and finds
the quote in the table's symptom column; ``...`` in a quote stands for text the message fills in,
and ``FILE`` for the file named, replaced by the one the case used.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from vcasync.cli import read_join_credential, read_join_secret
from vcasync.errors import ConfigError
from vcasync.worker._client import check_coordinator_url

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _symptoms() -> str:
    """The symptom column of the table under ``## Troubleshooting``, one row a line."""
    text = (DOCS / "operating.md").read_text()
    section = text.split("\n## Troubleshooting\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line.split(" | ", 1)[0] for line in section.splitlines() if line.startswith("| "))


def _error(make: Callable[[], object]) -> str:
    with pytest.raises(ConfigError) as info:
        make()
    return str(info.value)


def _short_secret_in_env(tmp_path: Path, env: pytest.MonkeyPatch) -> str:
    env.setenv("VCASYNC_JOIN_SECRET", "short")
    return _error(lambda: read_join_secret(None))


def _short_secret_in_file(tmp_path: Path, env: pytest.MonkeyPatch) -> str:
    path = tmp_path / "join-secret"
    path.write_text("short\n")
    return _error(lambda: read_join_secret(path))


#: (the quote as the table writes it, how to make the real message: given tmp_path, the env patch)
CASES: list[tuple[str, Callable[[Path, pytest.MonkeyPatch], str]]] = [
    ("no join credential",
     lambda tmp, env: _error(lambda: read_join_credential(None))),
    ("the join secret (VCASYNC_JOIN_SECRET) is too short", _short_secret_in_env),
    ("the join secret in FILE is too short", _short_secret_in_file),
    ("--coordinator ... is not a valid URL",
     lambda tmp, env: _error(lambda: check_coordinator_url("http://127.0.0.1:99999"))),
    ("must look like http(s)://host:port",
     lambda tmp, env: _error(lambda: check_coordinator_url("ftp://127.0.0.1:8080"))),
    ("--coordinator holds credentials (user:password@ ...)",
     lambda tmp, env: _error(lambda: check_coordinator_url("http://u:p@127.0.0.1:8080"))),
]


@pytest.mark.parametrize(("quote", "make"), CASES, ids=[quote for quote, _ in CASES])
def test_a_quoted_message_is_what_the_code_says(quote: str, make: Callable[[Path, pytest.MonkeyPatch], str],
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("VCASYNC_JOIN_SECRET", "VCASYNC_JOIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert f"`{quote}`" in _symptoms(), f"docs/operating.md's troubleshooting table no longer quotes " \
                                        f"{quote!r}"
    message = make(tmp_path, monkeypatch)
    pattern = ".*?".join(re.escape(part) for part in quote.split("..."))
    pattern = pattern.replace("FILE", re.escape(str(tmp_path / "join-secret")))
    assert re.search(pattern, message), f"the table quotes {quote!r}; the code says {message!r}"
