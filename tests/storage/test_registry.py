"""URL registry, options, key rules, install hints, and secrets kept out of sight."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vcasync.backends.gcs import GCSStorage
from vcasync.backends.local import LocalStorage
from vcasync.backends.memory import MemoryStorage
from vcasync.backends.s3 import S3Options, S3Storage

from vcasync.errors import BackendUnavailableError, ConfigError, InvalidKeyError
from vcasync.storage import (
    Storage,
    available_backends,
    backend_registry,
    open_storage,
    outlives_process,
    register_backend,
    validate_key,
    validate_prefix,
)
from vcasync.testing.emulators import DUMMY_S3_CREDENTIALS


def test_schemes_pick_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(available_backends()) >= {"file", "memory", "s3", "gs"}
    assert isinstance(open_storage("memory://x"), MemoryStorage)
    local = open_storage(tmp_path.as_uri())
    assert isinstance(local, LocalStorage)
    assert local.root == tmp_path
    plain = open_storage(str(tmp_path / "plain"))
    assert isinstance(plain, LocalStorage)
    assert plain.root == tmp_path / "plain"
    monkeypatch.chdir(tmp_path)
    assert open_storage("relative/dir").root == tmp_path / "relative" / "dir"  # type: ignore[attr-defined]
    s3 = open_storage("s3://bucket/some/prefix?region=eu-west-1&part_size=8388608")
    assert isinstance(s3, S3Storage)
    assert (s3.bucket, s3.prefix, s3.options.region, s3.options.part_size) == (
        "bucket", "some/prefix", "eu-west-1", 8 << 20)
    gs = open_storage("gs://bucket/p?emulator_host=127.0.0.1:1")
    assert isinstance(gs, GCSStorage)
    assert gs.url == "gs://bucket/p?emulator_host=http://127.0.0.1:1"
    for st_ in (local, s3, gs):
        assert isinstance(st_, Storage)


def test_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(BackendUnavailableError) as info:
        open_storage("ftp://host/x")
    assert "'ftp'" in str(info.value)
    for scheme in ("file://", "gs://", "memory://", "s3://"):
        assert scheme in str(info.value)


@pytest.mark.parametrize(("url", "module", "blocked", "extra"), [
    ("s3://bucket/x", "vcasync.backends.s3", "aiobotocore", "s3"),
    ("gs://bucket/x", "vcasync.backends.gcs", "gcloud.aio.storage", "gcs"),
])
def test_missing_dependency_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch, url: str,
                                                   module: str, blocked: str, extra: str) -> None:
    monkeypatch.delitem(sys.modules, module, raising=False)
    for name in [m for m in sys.modules if m == blocked or m.startswith(blocked + ".")]:
        monkeypatch.setitem(sys.modules, name, None)  # import now raises ImportError
    monkeypatch.setitem(sys.modules, blocked, None)
    with pytest.raises(BackendUnavailableError) as info:
        open_storage(url, registry=backend_registry())
    assert f"pip install 'vcasync[{extra}]'" in str(info.value)


def test_bad_options_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="colour"):
        open_storage("s3://bucket?colour=blue")
    with pytest.raises(ConfigError, match="colour"):
        open_storage("s3://bucket", colour="blue")
    with pytest.raises(ConfigError, match="secret"):
        open_storage("s3://bucket?aws_secret_access_key=abc")
    with pytest.raises(ConfigError, match="both"):
        open_storage("s3://bucket?region=a", region="b")
    with pytest.raises(ConfigError, match="part_size"):
        open_storage("s3://bucket?part_size=1024")
    with pytest.raises(ConfigError, match="'part_size' must be int"):
        open_storage("s3://bucket?part_size=big")
    with pytest.raises(ConfigError, match="'durable' must be bool"):
        open_storage(f"{tmp_path.as_uri()}?durable=maybe")
    with pytest.raises(ConfigError, match="256 KiB"):
        open_storage("gs://bucket?chunk_size=1000")
    with pytest.raises(ConfigError):
        open_storage("s3:///no-bucket")
    with pytest.raises(ConfigError):
        open_storage("file://remotehost/x")
    with pytest.raises(ConfigError):
        open_storage("memory://x?option=1")
    assert open_storage(f"{tmp_path.as_uri()}?durable=false").options.durable is False  # type: ignore[attr-defined]
    # found by hand: these became directories named 'file:rel' and 'plain?durable=false'
    with pytest.raises(ConfigError, match="looks like a URL without '//'"):
        open_storage("file:rel")
    with pytest.raises(ConfigError, match="a plain path takes no options"):
        open_storage(f"{tmp_path}/plain?durable=false")


async def test_a_root_whose_parents_are_missing_is_created_with_them(tmp_path: Path) -> None:
    # The docs promise "a missing one is created on the first write"; a root two levels below
    # anything that existed failed every write with ENOENT (the k8s base layout's state root).
    root = tmp_path / "not" / "yet" / "run"
    async with open_storage(root.as_uri()) as st:
        await st.put("a/b", b"x")
        assert await st.get("a/b") == b"x"
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(ConfigError, match="is not a directory"):
        open_storage((tmp_path / "file" / "run").as_uri())


def test_register_backend_validates() -> None:
    class Thing:
        pass

    with pytest.raises(BackendUnavailableError, match="from_url"):
        register_backend("thing", Thing)

    class Mine:
        @classmethod
        def from_url(cls, url: str) -> Storage:
            return MemoryStorage(url.partition("://")[2])

    registry = backend_registry()
    registry.register("mine", Mine)
    storage = open_storage("mine://zone", registry=registry)
    assert storage.url == "memory://zone"


async def test_secrets_stay_out_of_reprs_and_logs(s3_endpoint: str, caplog: pytest.LogCaptureFixture
                                                  ) -> None:
    secret = "SUPER-SECRET-9f2c"
    storage = open_storage("s3://vcasync-tests/secrets", endpoint_url=s3_endpoint,
                           aws_access_key_id="AKIDTEST", aws_secret_access_key=secret,
                           aws_session_token=secret + "-token")
    assert isinstance(storage, S3Storage)
    for text in (repr(storage), str(storage), storage.url, repr(storage.options), str(storage.options)):
        assert secret not in text
    with caplog.at_level(logging.DEBUG):
        async with storage:
            await storage.put("k", b"v")
            assert await storage.get("k") == b"v"
            await storage.delete("k")
    assert caplog.records  # botocore logged its requests, signed headers included...
    assert secret not in caplog.text.replace(secret + "-token", "")  # ...but never the secret key
    # (botocore's own DEBUG log shows the session token header; vcasync never logs either)
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("vcasync"))
    assert secret not in ours
    assert "AKIDTEST" not in repr(S3Options(aws_access_key_id="AKIDTEST"))


def test_dummy_credentials_are_dummies() -> None:
    assert DUMMY_S3_CREDENTIALS["aws_secret_access_key"] == "testing"


BAD = ["", "/a", "a//b", "a/", "..", "a/../b", ".", "a/./b", "x\x00", "x\n", "x\\y", "\x7f",
       "é" * 513, "\udc80"]


@pytest.mark.parametrize("key", BAD)
def test_invalid_keys(key: str) -> None:
    with pytest.raises(InvalidKeyError):
        validate_key(key)


def test_prefix_rules() -> None:
    assert validate_prefix("") == ""
    assert validate_prefix("a/b/") == "a/b/"
    for bad in ("/a", "a//", "../", "a/../", "x\x01"):
        with pytest.raises(InvalidKeyError):
            validate_prefix(bad)


_segment = st.text(st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters="/\\"),
                   min_size=1, max_size=12).filter(lambda s: s not in (".", ".."))


@given(st.lists(_segment, min_size=1, max_size=6))
def test_keys_from_good_segments_are_accepted(segments: list[str]) -> None:
    key = "/".join(segments)
    if len(key.encode()) <= 1024:
        assert validate_key(key) == key


@given(st.text(max_size=40))
def test_validation_only_ever_raises_invalid_key(text: str) -> None:
    try:
        validate_key(text)
    except InvalidKeyError:
        return
    assert text
    assert not text.startswith("/")
    assert "//" not in text
    assert not text.endswith("/")


def test_which_stores_outlive_the_process_that_opens_them(tmp_path: Path) -> None:
    # memory:// is gone with its process (a coordinator restarted on it starts the run over)
    assert not outlives_process("memory://x")
    for url in (str(tmp_path), tmp_path.as_uri(), tmp_path, "s3://bucket/p", "gs://bucket/p"):
        assert outlives_process(url), url

    class ThirdParty:                        # says nothing: taken to be durable
        @staticmethod
        def from_url(url: str, **options: object) -> Storage:
            raise AssertionError("never opened")

    class Scratch(ThirdParty):
        process_local = True

    registry = backend_registry()
    registry.register("third", ThirdParty)
    registry.register("scratch", Scratch)
    assert outlives_process("third://x", registry=registry)
    assert not outlives_process("scratch://x", registry=registry)
    with pytest.raises(BackendUnavailableError, match="nope"):
        outlives_process("nope://x", registry=registry)


@pytest.fixture
def installed_backends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package of storage backends as pip installs it (its ``.dist-info`` with entry points),
    on ``sys.path``: ``backend_registry()`` finds them through ``importlib.metadata``."""
    site = tmp_path / "site"
    info = site / "probe_backends-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-backends\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[vcasync.backends]\n"
        "boom = probe_backends_boom:Store\n"
        "nothing = probe_backends:NoSuchStore\n"
        "memory = probe_backends:Store\n"
        "probe = probe_backends:Store\n")
    (site / "probe_backends_boom.py").write_text('raise RuntimeError("no driver for this box")\n')
    (site / "probe_backends.py").write_text(
        "from vcasync.backends.memory import MemoryStorage\n\n"
        "class Store:\n"
        "    @staticmethod\n"
        "    def from_url(url, **options):\n"
        "        return MemoryStorage(url.partition('://')[2])\n")
    monkeypatch.syspath_prepend(str(site))
    for module in ("probe_backends", "probe_backends_boom"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return site


def test_a_backend_that_cannot_load_is_named_with_its_problem(installed_backends: Path) -> None:
    # Its module raising something else than ImportError, or its entry point naming an object the
    # module lacks, escaped as that exception: `vcasync coordinator --storage boom://x` died with
    # a traceback (exit 1) instead of a configuration error naming the backend (exit 2).
    registry = backend_registry()
    assert open_storage("probe://x", registry=registry).url == "memory://x"
    with pytest.raises(BackendUnavailableError) as info:
        open_storage("boom://x", registry=registry)
    assert str(info.value) == ("the boom:// storage backend: cannot load probe_backends_boom:Store: "
                               "RuntimeError: no driver for this box")
    with pytest.raises(BackendUnavailableError, match=r"the nothing:// storage backend: cannot load "
                                                      r"probe_backends:NoSuchStore: AttributeError"):
        open_storage("nothing://x", registry=registry)


def test_a_scheme_two_installed_packages_provide_is_refused_naming_both(
        installed_backends: Path) -> None:
    # vcasync and probe-backends both declare memory://: which one opened depended on the order
    # importlib.metadata found them in, silently.
    registry = backend_registry()
    with pytest.raises(BackendUnavailableError) as info:
        open_storage("memory://x", registry=registry)
    message = str(info.value)
    assert message.startswith("the memory:// storage backend: 2 installed packages provide it")
    assert "vcasync (vcasync.backends.memory:MemoryStorage)" in message
    assert "probe-backends (probe_backends:Store)" in message


def test_registering_over_an_installed_scheme_needs_replace() -> None:
    # register_backend("file", X) replaced the built-in file:// silently while its entry point was
    # not loaded yet (and refused the same call once it was).
    class Mine:
        @staticmethod
        def from_url(url: str, **options: object) -> Storage:
            return MemoryStorage("mine")

    registry = backend_registry()
    with pytest.raises(BackendUnavailableError, match="'file' is already registered"):
        registry.register("file", Mine)
    assert isinstance(open_storage("/tmp/x", registry=registry), LocalStorage)
    registry.register("file", Mine, replace=True)
    assert open_storage("/tmp/x", registry=registry).url == "memory://mine"


def test_a_backend_whose_from_url_returns_no_storage_is_named_with_what_it_lacks() -> None:
    # A backend lacking put_stream was refused by the coordinator as "storage must implement
    # vcasync.Storage (or be None), got NoStream", saying neither what was missing nor which
    # backend made it; used directly, it failed later, as an AttributeError or TypeError.
    class NoStream(MemoryStorage):
        put_stream = None               # type: ignore[assignment]
        open_read = None                # type: ignore[assignment]

    class Factory:
        @staticmethod
        def from_url(url: str, **options: object) -> Storage:
            return NoStream(url.partition("://")[2])

    registry = backend_registry()
    registry.register("halfway", Factory)
    with pytest.raises(BackendUnavailableError) as info:
        open_storage("halfway://x", registry=registry)
    assert str(info.value) == ("the halfway:// storage backend's from_url returned a NoStream, which "
                               "lacks open_read, put_stream of the vcasync.storage.Storage contract")


@pytest.mark.parametrize("scheme", ["Mem", "m", "my_store", "my store", "9p", ""])
def test_a_backend_under_a_scheme_no_url_can_name_is_refused(scheme: str) -> None:
    # register_backend("Mem", ...) was taken, and every "Mem://x" then failed as an unknown scheme
    # 'mem' (URLs' schemes are read lowercased), or "my_store://x" as a file path
    with pytest.raises(BackendUnavailableError, match="a URL scheme is a lowercase letter"):
        backend_registry().register(scheme, MemoryStorage)


def test_a_scheme_with_digits_and_punctuation_opens() -> None:
    class Mine:
        @staticmethod
        def from_url(url: str, **options: object) -> Storage:
            return MemoryStorage(url.partition("://")[2])

    registry = backend_registry()
    registry.register("my-store+v2.x", Mine)
    assert open_storage("my-store+v2.x://zone", registry=registry).url == "memory://zone"
