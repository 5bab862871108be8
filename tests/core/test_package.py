"""The package surface: curated __all__, one error tree, the namespace mapping."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points

import vcasync
from vcasync import errors


def test_all_is_curated_and_importable() -> None:
    assert sorted(vcasync.__all__) == sorted(set(vcasync.__all__))
    for name in vcasync.__all__:
        assert hasattr(vcasync, name), name


def test_one_error_tree() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert inspect.isclass(cls), name
        assert issubclass(cls, errors.VCAsyncError), name
        assert name in (errors.__doc__ or ""), f"{name} missing from the tree in the docstring"


def test_backends_and_plugins_live_inside_the_namespace() -> None:
    assert importlib.import_module("vcasync.backends").__name__ == "vcasync.backends"
    assert importlib.import_module("vcasync.plugins").__name__ == "vcasync.plugins"
    backends = {ep.name for ep in entry_points(group="vcasync.backends")}
    assert backends >= {"file", "memory", "s3", "gs"}
    assert "vcasgd" in {ep.name for ep in entry_points(group="vcasync.policies")}


def test_embedded_import_does_not_load_the_http_side() -> None:
    import subprocess
    import sys

    code = (
        "import sys, vcasync\n"
        "assert 'aiohttp' not in sys.modules, 'import vcasync loaded aiohttp'\n"
        "assert vcasync.Worker.__name__ == 'Worker'\n"
        "assert 'aiohttp' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
