"""The import rules of docs/architecture.md, checked on the source (static: parsed with ``ast``).

The page's tables are the rules, so the page cannot drift from the code: the room table says
which modules each room holds and which rooms it may import; the second table names third-party
packages a room never imports, directly or through a room it imports. On top of them:

* every module of vcasync (and of the backends and plugins installed under it) is in exactly one
  room, and every room of the table exists;
* the rooms marked *public API only* import nothing private of another room: no ``vcasync._x`` or
  ``vcasync.pkg._x`` module, no name outside the module's ``__all__``;
* there is no cycle between rooms;
* the "Inside the big rooms" table names every module of those rooms, and no other.

Imports under ``if TYPE_CHECKING:`` never run, so they are left out of the arrows (not of the
public-API rule: a type is API too).
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"
#: Where each installed package's source lives in the repository (see pyproject's package-dir).
SOURCES = {"vcasync": REPO / "vcasync", "vcasync.backends": REPO / "backends",
           "vcasync.plugins": REPO / "plugins"}
PUBLIC_ONLY = "public API only"


@dataclass(frozen=True)
class Room:
    name: str
    modules: tuple[str, ...]          # module names, or package names standing for all under them
    may_import: frozenset[str]        # names of other rooms
    public_only: bool = False


@dataclass(frozen=True)
class Import:
    source: str                       # the importing module
    target: str                       # the imported module (resolved, absolute)
    names: tuple[str, ...]            # names taken from it (``from m import a, b``), else ()
    line: int
    runtime: bool                     # False under ``if TYPE_CHECKING:``


@dataclass
class Rules:
    rooms: list[Room]
    never: dict[str, frozenset[str]] = field(default_factory=dict)   # room -> third-party packages


# -- the page ------------------------------------------------------------------------------------

def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first Markdown table after ``heading``, as lists of cell texts."""
    at = text.index(heading)
    rows: list[list[str]] = []
    for line in text[at:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not all(set(c) <= set("-: ") for c in cells):
            rows.append(cells)
    return rows[1:]     # without the header


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def parse_rules(text: str) -> Rules:
    rooms = []
    for cells in _table(text, "## The rooms"):
        name = _names(cells[0])[0]
        rooms.append(Room(name=name, modules=tuple(_names(cells[1])),
                          may_import=frozenset(_names(cells[3])), public_only=PUBLIC_ONLY in cells[3]))
    never = {_names(c[0])[0]: frozenset(_names(c[1])) for c in _table(text, "## Kept out")}
    return Rules(rooms, never)


# -- the source ----------------------------------------------------------------------------------

def find_modules(sources: Mapping[str, Path]) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` under each source root (packages by their name)."""
    found: dict[str, Path] = {}
    for package, root in sources.items():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def read_imports(modules: Mapping[str, Path]) -> Iterator[Import]:
    """Every import of every module, relative ones resolved against the importing package."""
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), filename=str(path))
        typed_only = _type_checking_lines(tree)
        for node in ast.walk(tree):
            runtime = node.lineno not in typed_only if isinstance(node, ast.stmt) else True
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(module, alias.name, (), node.lineno, runtime)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = tuple(a.name for a in node.names)
                submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
                if submodules:     # ``from pkg import module``: an import of that module
                    for sub in submodules:
                        yield Import(module, sub, (), node.lineno, runtime)
                    names = tuple(n for n in names if f"{target}.{n}" not in modules)
                    if not names:
                        continue
                yield Import(module, target, names, node.lineno, runtime)


# -- the check -----------------------------------------------------------------------------------

def room_of(rules: Rules, module: str) -> Room | None:
    """The room holding ``module``: the one naming it or, failing that, its nearest package (a top
    package, without a dot, stands for its ``__init__`` only)."""
    best: tuple[int, Room] | None = None
    for room in rules.rooms:
        for m in room.modules:
            covers = module == m or ("." in m and module.startswith(m + "."))
            if covers and (best is None or len(m) > best[0]):
                best = (len(m), room)
    return None if best is None else best[1]


def _private(module: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in module.split("."))


def _public_names(path: Path) -> set[str] | None:
    """The module's ``__all__`` when it spells one out as a literal list or tuple."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def _cycles(arrows: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of more than one room (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(arrows.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(arrows):
        if v not in index:
            visit(v)
    return groups


def check(rules: Rules, sources: Mapping[str, Path]) -> list[str]:
    """Every broken rule, one line each (empty: the tree keeps the page's rules)."""
    modules = find_modules(sources)
    tops = {package.split(".")[0] for package in sources}
    problems: list[str] = []
    known = {r.name for r in rules.rooms}
    for room in rules.rooms:
        for m in room.modules:
            if m not in modules:
                problems.append(f"room {room.name}: {m} does not exist")
        for other in sorted(room.may_import - known):
            problems.append(f"room {room.name}: may import {other}, which is no room")
    for module in modules:
        if room_of(rules, module) is None:
            problems.append(f"{module} is in no room of the table")
    arrows: dict[str, set[str]] = {r.name: set() for r in rules.rooms}
    third_party: dict[str, set[str]] = {r.name: set() for r in rules.rooms}
    for imp in read_imports(modules):
        src = room_of(rules, imp.source)
        if src is None:
            continue
        if imp.target.split(".")[0] not in tops:
            if imp.runtime:
                third_party[src.name].add(imp.target.split(".")[0])
            continue
        dst = room_of(rules, imp.target)
        where = f"{imp.source} (line {imp.line}) imports {imp.target}"
        if dst is None:
            problems.append(f"{where}, which is in no room")
            continue
        if dst is src:
            continue
        if src.public_only:
            if _private(imp.target):
                problems.append(f"{where}: a private module ({src.name} uses public API only)")
            elif imp.target in modules:
                public = _public_names(modules[imp.target])
                hidden = sorted(n for n in imp.names if public is not None and n not in public)
                if hidden:
                    problems.append(f"{where}: {', '.join(hidden)} not in its __all__ "
                                    f"({src.name} uses public API only)")
        if not imp.runtime:
            continue
        arrows[src.name].add(dst.name)
        if dst.name not in src.may_import:
            problems.append(f"{where}: room {src.name} may not import room {dst.name} "
                            f"(docs/architecture.md)")
    for room, packages in rules.never.items():
        reach, todo = {room}, [room]
        while todo:
            for nxt in arrows.get(todo.pop(), ()):
                if nxt not in reach:
                    reach.add(nxt)
                    todo.append(nxt)
        for r in sorted(reach):
            for pkg in sorted(third_party.get(r, set()) & packages):
                via = "" if r == room else f" through room {r}"
                problems.append(f"room {room} imports {pkg}{via}")
    for group in _cycles(arrows):
        problems.append(f"import cycle between rooms: {' <-> '.join(group)}")
    return problems


def check_inside(text: str, rules: Rules, sources: Mapping[str, Path]) -> list[str]:
    """The page's "Inside the big rooms" table names each module of those rooms, and only those."""
    modules = find_modules(sources)
    rooms = {r.name: r for r in rules.rooms}
    named: dict[str, set[str]] = {}
    room = ""
    for cells in _table(text, "## Inside the big rooms"):
        room = (_names(cells[0]) or [room])[0]
        named.setdefault(room, set()).update(_names(cells[1]))
    problems = []
    for name, listed in named.items():
        package = rooms[name].modules[0]
        inside = {m[len(package) + 1:] for m in modules if m.startswith(package + ".")}
        problems += [f"{name}: {m} is not listed inside the room" for m in sorted(inside - listed)]
        problems += [f"{name}: {m} is listed but does not exist" for m in sorted(listed - inside)]
    return problems


# -- the tests -----------------------------------------------------------------------------------

def test_the_source_keeps_the_import_rules_of_the_architecture_page() -> None:
    rules = parse_rules(PAGE.read_text())
    assert len(rules.rooms) > 10
    assert rules.never
    assert check(rules, SOURCES) == []


def test_the_page_lists_every_module_of_the_big_rooms() -> None:
    text = PAGE.read_text()
    assert check_inside(text, parse_rules(text), SOURCES) == []


def test_the_page_names_the_rules_the_issue_asks_for() -> None:
    rules = parse_rules(PAGE.read_text())
    rooms = {r.name: r for r in rules.rooms}
    assert rooms["backends"].public_only
    assert rooms["plugins"].public_only
    assert "aiohttp" in rules.never["coordinator"]
    # "wire imports nothing above it": only leaf rooms (registry imports nothing) and the value types.
    assert rooms["wire"].may_import <= {"errors", "tensors", "aio", "registry"}
    assert rooms["registry"].may_import == set()


PAGE_OF_A_SMALL_TREE = """
## The rooms

| room | modules | its one job | may import |
|---|---|---|---|
| `errors` | `pkg.errors` | the exceptions | nothing |
| `wire` | `pkg.wire` | bytes | `errors` |
| `core` | `pkg.core` | the core | `errors`, `wire` |
| `aio` | `pkg._aio` | helpers | nothing |
| `plugins` | `pkg.plugins` | policies | `errors`, `core`; public API only |
| `facade` | `pkg` | the package | `core` |

## Kept out

| room | never imports |
|---|---|
| `core` | `aiohttp` |
"""


def _tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for name, body in {"__init__.py": "", "errors.py": "__all__ = ['Oops']\nclass Oops(Exception): ...\n",
                       "_aio.py": "", "wire/__init__.py": "from ..errors import Oops\n",
                       "core/__init__.py": "__all__ = ['run']\nfrom .. import wire\nrun = 1\n",
                       "core/_hidden.py": "x = 1\n", "plugins/__init__.py": "", **files}.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))
    return {"pkg": tmp_path / "pkg"}


def test_a_clean_synthetic_tree_passes(tmp_path: Path) -> None:
    sources = _tree(tmp_path, {"plugins/good.py": "from pkg.core import run\nfrom pkg.errors import Oops\n"})
    assert check(parse_rules(PAGE_OF_A_SMALL_TREE), sources) == []


@pytest.mark.parametrize(("files", "complaint"), [
    ({"wire/codec.py": "from ..core import run\n"},
     "room wire may not import room core"),
    ({"plugins/bad.py": "from pkg.core._hidden import x\n"},
     "a private module (plugins uses public API only)"),
    ({"plugins/bad.py": "from pkg._aio import x\n"},
     "a private module (plugins uses public API only)"),
    ({"plugins/bad.py": "from pkg.core import secret\n"},
     "secret not in its __all__"),
    ({"core/_net.py": "import aiohttp\n"},
     "room core imports aiohttp"),
    ({"wire/net.py": "import aiohttp.web\n"},
     "room core imports aiohttp through room wire"),
    ({"errors.py": "from .wire import x\n"},
     "room errors may not import room wire"),
    ({"new.py": "x = 1\n"},
     "pkg.new is in no room of the table"),
], ids=["upward-arrow", "plugin-private-module", "plugin-private-helper", "plugin-name-outside-all",
        "aiohttp-direct", "aiohttp-through-a-room", "errors-imports-up", "module-in-no-room"])
def test_a_wrong_way_arrow_in_a_synthetic_tree_is_named(tmp_path: Path, files: dict[str, str],
                                                         complaint: str) -> None:
    problems = check(parse_rules(PAGE_OF_A_SMALL_TREE), _tree(tmp_path, files))
    assert any(complaint in p for p in problems), problems


def test_a_cycle_between_rooms_is_named_and_type_checking_imports_are_not_arrows(tmp_path: Path) -> None:
    page = PAGE_OF_A_SMALL_TREE.replace("| `wire` | `pkg.wire` | bytes | `errors` |",
                                        "| `wire` | `pkg.wire` | bytes | `errors`, `core` |")
    cyclic = _tree(tmp_path / "a", {"wire/codec.py": "from ..core import run\n"})
    assert "import cycle between rooms: core <-> wire" in check(parse_rules(page), cyclic)
    typed = _tree(tmp_path / "b", {"wire/codec.py": "from typing import TYPE_CHECKING\n"
                                                     "if TYPE_CHECKING:\n    from ..core import run\n"})
    assert check(parse_rules(PAGE_OF_A_SMALL_TREE), typed) == []


def test_a_stale_row_is_named(tmp_path: Path) -> None:
    page = PAGE_OF_A_SMALL_TREE.replace("| `aio` | `pkg._aio` |", "| `aio` | `pkg._aio`, `pkg.gone` |")
    assert "room aio: pkg.gone does not exist" in check(parse_rules(page), _tree(tmp_path, {}))


def test_a_module_missing_from_the_inside_table_is_named(tmp_path: Path) -> None:
    page = PAGE_OF_A_SMALL_TREE + "\n## Inside the big rooms\n\n| room | module | what |\n|---|---|---|\n" \
        "| `core` | `_gone` | a module that was removed |\n"
    assert check_inside(page, parse_rules(page), _tree(tmp_path, {})) == [
        "core: _hidden is not listed inside the room", "core: _gone is listed but does not exist"]
