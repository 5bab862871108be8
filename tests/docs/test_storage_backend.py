"""The backend written on docs/storage.md ("Writing a backend") passes the conformance suite shown
there: the page's own test class, built from the page's code blocks, is collected and run here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[2] / "docs" / "storage.md"


def _page_namespace() -> dict[str, Any]:
    text = PAGE.read_text()
    start = re.search(r"^## Writing a backend", text, re.M).start()   # not "### Writing a backend"
    end = text.index("\n## ", text.index("## The conformance suite"))
    # nothing from the rest of the page: a reader copies this section's blocks on their own
    namespace: dict[str, Any] = {"__name__": "docs_storage_backend"}
    for match in re.finditer(r"^```python\n(.*?)^```", text[start:end], re.S | re.M):
        exec(compile(match.group(1), str(PAGE), "exec"), namespace)
    return namespace


_NS = _page_namespace()
TestDocsDictStorage = _NS["TestDictStorage"]


def test_the_page_registers_nothing_for_good() -> None:
    from vcasync import available_backends

    assert "dict" not in available_backends()


def test_every_backend_option_is_on_the_page() -> None:
    """Each option a built-in backend accepts (its options dataclass) has a row on docs/storage.md."""
    import dataclasses

    import pytest

    pytest.importorskip("aiobotocore")
    pytest.importorskip("gcloud.aio.storage")
    from vcasync.backends.gcs import GCSOptions
    from vcasync.backends.local import LocalOptions
    from vcasync.backends.s3 import S3Options

    text = PAGE.read_text()
    for cls in (LocalOptions, S3Options, GCSOptions):
        for f in dataclasses.fields(cls):
            if f.metadata.get("secret"):
                assert f"`{f.name}`" in text, f"{cls.__name__}.{f.name} is not on the page"
            else:
                assert re.search(rf"^\| `{f.name}`|, `{f.name}`", text, re.M), \
                    f"{cls.__name__}.{f.name} has no row on docs/storage.md"
