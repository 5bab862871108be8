"""The typed API as a user's own code sees it: ``mypy --strict`` on a file outside the package.

``tools/typecheck.py`` checks vcasync itself; these check that what the docs show a user writing
type-checks too (the package ships ``py.typed``, so a user's CI runs mypy against these types).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow     # mypy on torch's stubs: about half a minute


def _link_tree(tmp_path: Path) -> Path:
    """The installed layout (backends/ and plugins/ inside vcasync), as tools/typecheck.py builds it."""
    tree = tmp_path / "tree"
    pkg = tree / "vcasync"
    pkg.mkdir(parents=True)
    for entry in (ROOT / "vcasync").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "backends").symlink_to(ROOT / "backends")
    (pkg / "plugins").symlink_to(ROOT / "plugins")
    return tree


def _mypy_strict(tmp_path: Path, source: str) -> tuple[str, int]:
    api = pytest.importorskip("mypy.api")
    user = tmp_path / "user_code.py"
    user.write_text(textwrap.dedent(source))
    config = tmp_path / "mypy.ini"
    config.write_text(f"[mypy]\nmypy_path = {_link_tree(tmp_path)}\n")
    out, err, status = api.run(["--strict", "--follow-imports=silent", "--config-file", str(config),
                                "--cache-dir", str(tmp_path / "cache"), str(user)])
    return out + err, status


def test_a_storage_with_a_url_property_is_a_storage(tmp_path: Path) -> None:
    """testing.md wraps a store in FaultyStorage so the code under test sees faults, and a store
    of the user's own may expose ``url`` as a read-only property: both are a ``Storage`` to hand a
    Coordinator (the protocol named ``url`` a settable attribute, which a property is not)."""
    out, status = _mypy_strict(tmp_path, '''
        from __future__ import annotations

        import torch
        from vcasync import Coordinator, ModelState, Storage, build_policy, make_units, open_storage
        from vcasync.testing.faults import FaultPlan, FaultyStorage


        async def main() -> None:
            async with open_storage("memory://types") as inner:
                flaky = FaultyStorage(inner, FaultPlan(fail=0.1), seed=7)
                store: Storage = flaky
                async with Coordinator(
                    ModelState.from_module(torch.nn.Linear(1, 1)), make_units(1, epochs=1, steps=1),
                    policy=build_policy("vcasgd"), storage=flaky,
                ) as coord:
                    print(coord.version, store.url)
    ''')
    assert status == 0, out


def test_the_storage_page_s_backend_is_a_storage(tmp_path: Path) -> None:
    """docs/storage.md's complete backend, copied as a user would, is a ``Storage`` to mypy: its
    ``put``/``put_stream`` took ``bytes`` where the protocol passes bytes, bytearray or memoryview
    (which the page says a backend accepts), so ``from_url(...) -> Storage`` failed to check."""
    page = (ROOT / "docs" / "storage.md").read_text()
    blocks = [b for b in page.split("```python\n")[1:] if "class DictStorage" in b]
    assert len(blocks) == 1, "docs/storage.md should hold one DictStorage example"
    source = blocks[0].split("```", 1)[0]
    out, status = _mypy_strict(tmp_path, "from vcasync import Storage, open_storage\n" + source + '''

def as_storage(url: str) -> Storage:
    return DictStorage.from_url(url)
''')
    assert status == 0, out
