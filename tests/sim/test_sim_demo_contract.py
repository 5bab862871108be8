"""The contract line between the simulator and the demo (issue 15): neither imports the other.

Models, trainers and evaluations live in ``vcasync.examples``; prices and cost-to-target arithmetic in
``vcasync.costing``; both sides import them from there. Static (``ast``): a lazy import inside a
function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import vcasync

ROOT = Path(vcasync.__file__).parent

# package -> the vcasync packages it must never import
FORBIDDEN = {
    "sim": {"demo"},
    "demo": {"sim"},
    "examples": {"sim", "demo", "costing"},
    "costing": {"sim", "demo", "examples"},
}


def vcasync_imports(source: str, package: str) -> set[str]:
    """The first-level vcasync packages a module of ``vcasync.<package>`` imports (absolute or relative)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                names = [node.module or ""]
            elif node.level == 1:     # from .x import y / from . import y: inside the package itself
                names = [f"vcasync.{package}"]
            else:                     # from ..x import y / from .. import x
                mods = [node.module] if node.module else [a.name for a in node.names]
                names = [f"vcasync.{m}" for m in mods]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "vcasync" and len(parts) > 1:
                found.add(parts[1])
    return found


def violations(root: Path) -> list[str]:
    out = []
    for package, banned in FORBIDDEN.items():
        for path in sorted((root / package).rglob("*.py")):
            for bad in sorted(vcasync_imports(path.read_text(), package) & banned):
                out.append(f"{path.relative_to(root)} imports vcasync.{bad}")
    return out


def test_sim_and_demo_never_import_each_other() -> None:
    assert violations(ROOT) == []


@pytest.mark.parametrize(("package", "line", "bad"), [
    ("sim", "from ..demo.cnn import SmallCNN", "demo"),
    ("sim", "from .. import demo", "demo"),
    ("demo", "import vcasync.sim.engine", "sim"),
    ("demo", "def f():\n    from vcasync.sim import Simulation\n", "sim"),
])
def test_the_check_sees_a_wrong_way_import(tmp_path: Path, package: str, line: str, bad: str) -> None:
    for name in FORBIDDEN:
        (tmp_path / name).mkdir()
    (tmp_path / package / "bad.py").write_text(line + "\n")
    assert violations(tmp_path) == [f"{package}/bad.py imports vcasync.{bad}"]


def test_the_check_allows_the_shared_rooms() -> None:
    assert vcasync_imports("from ..examples.cnn import SmallCNN\nfrom ..costing.target import Target\n"
                           "from .engine import Simulation\n", "sim") == {"examples", "costing", "sim"}
