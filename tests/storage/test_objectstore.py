"""S3 and GCS build on one object-store base: the call/create/put-stream plumbing exists once."""

from __future__ import annotations

import pytest
from vcasync.backends._objectstore import ObjectStore, status_error
from vcasync.backends.gcs import GCSStorage
from vcasync.backends.s3 import S3Storage

from vcasync.errors import (
    AccessDeniedError,
    ConfigError,
    ObjectNotFoundError,
    PreconditionFailedError,
    StorageError,
    TransientStorageError,
)

SHARED = ("_call", "_create", "put", "put_stream", "exists", "preflight", "_full", "_resume_read")


@pytest.mark.parametrize("cls", [S3Storage, GCSStorage])
def test_both_stores_inherit_the_shared_plumbing(cls: type[ObjectStore]) -> None:
    assert issubclass(cls, ObjectStore)
    assert [name for name in SHARED if name in vars(cls) and name != "preflight"] == []


@pytest.mark.parametrize(("status", "kind"), [
    (404, ObjectNotFoundError), (401, AccessDeniedError), (403, AccessDeniedError),
    (412, PreconditionFailedError), (408, TransientStorageError), (429, TransientStorageError),
    (500, TransientStorageError), (503, TransientStorageError), (400, StorageError),
])
def test_status_error(status: int, kind: type[StorageError]) -> None:
    error = status_error(status, "gs://b/: get 'k': boom", "k")
    assert type(error) is kind
    assert error.key == "k"


@pytest.mark.parametrize(("url", "store"), [("s3:///p", "S3"), ("gs:///p", "GCS")])
def test_a_missing_bucket_is_named(url: str, store: str) -> None:
    cls = S3Storage if store == "S3" else GCSStorage
    with pytest.raises(ConfigError, match=f"^{store}: a bucket name is required"):
        cls.from_url(url)


def test_keys_too_long_with_the_prefix_are_refused_the_same_way() -> None:
    s3, gcs = S3Storage("b", "p" * 1000), GCSStorage("b", "p" * 1000)
    messages = set()
    for store in (s3, gcs):
        with pytest.raises(StorageError, match="too long with the prefix") as info:
            store._full("k" * 100)
        messages.add(str(info.value).split(": ", 1)[1])
    assert len(messages) == 1
