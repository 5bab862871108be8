"""The README runs as printed: its Python blocks execute, its ``run.toml`` is a valid configuration
and every shell line is a command this repository accepts (flags, extras, tox environments,
environment variables); the main and test commands themselves are run by tests/demo and the suite.

The shell blocks of every docs page are held to the same check; ``python -m vcasync ...`` and
``python -m bench.NAME ...`` lines are parsed by the real parser (the bench's ``parse``), never run.
"""

from __future__ import annotations

import argparse
import configparser
import importlib
import re
import shlex
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from vcasync.cli import ENVIRONMENT, available_commands, build_parser

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
SHELL_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Other programs' commands the pages show (cloud and container tools): not ours to check; ``python``
#: is ours with ``-m vcasync`` or ``-m bench.NAME`` (:func:`_check_module_line`).
FOREIGN = frozenset({"pytest", "mkdocs", "cd", "git", "python", "curl", "kubectl", "docker", "gcloud", "aws",
                     "ray", "kustomize"})


def _blocks(path: Path, *langs: str) -> list[tuple[str, int]]:
    text = path.read_text()
    return [(m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)
            if m.group(1) in langs]


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _tox_envs() -> set[str]:
    ini = configparser.ConfigParser()
    ini.read(ROOT / "tox.ini")
    return {s.removeprefix("testenv:") for s in ini.sections() if s.startswith("testenv:")}


def _parses(command: str, parse: Callable[[list[str]], object], args: list[str]) -> None:
    try:
        parse(args)
    except SystemExit as exc:
        if exc.code != 0:          # 0: --help
            raise AssertionError(f"{command!r} is not a valid command line") from exc


def _check_module_line(command: str, module: str, args: list[str], parser: argparse.ArgumentParser) -> None:
    """``python -m vcasync ARGS`` by the vcasync parser, ``python -m bench.NAME ARGS`` by the bench's
    own ``parse`` (what its ``main`` parses with): parsed only, never run."""
    if module == "vcasync":
        _parses(command, parser.parse_args, args)
        return
    name = module.removeprefix("bench.")
    try:
        bench = importlib.import_module(f"bench.{name}")
    except ModuleNotFoundError as exc:
        raise AssertionError(f"{command!r}: there is no bench {module}") from exc
    parse = getattr(bench, "parse", None)
    assert callable(parse), f"{command!r}: {module} has no parse(argv) to check it with; add one"
    _parses(command, parse, args)


def check_shell_line(line: str, parser: argparse.ArgumentParser) -> None:
    """Raise AssertionError unless ``line`` (one command, maybe joined by ``&&``) is one we accept."""
    for command in (c.strip() for c in line.split("&&")):
        words = shlex.split(command, comments=True)
        if not words:
            continue
        if words[0] == "vcasync":
            try:
                parser.parse_args(words[1:])
            except SystemExit as exc:
                if exc.code != 0:          # 0: --help
                    raise AssertionError(f"{command!r} is not a valid vcasync command line") from exc
        elif words[:2] == ["pip", "install"]:
            for word in words[2:]:
                for extra in re.findall(r"\[([\w,-]+)\]", word):
                    unknown = set(extra.split(",")) - _extras()
                    assert not unknown, f"{command!r}: no extra {unknown} in pyproject.toml"
        elif words[0] == "tox":
            assert words[1:2] == ["-e"], f"{command!r}: name the tox env with -e"
            assert words[2] in _tox_envs(), f"{command!r}: no such tox env"
        elif (words[0] in ("python", "python3") and words[1:2] == ["-m"] and len(words) > 2
              and (words[2] == "vcasync" or words[2].startswith("bench."))):
            _check_module_line(command, words[2], words[3:], parser)
        elif words[0] == "export":
            var = words[1].partition("=")[0]
            assert var in ENVIRONMENT, f"{command!r}: {var} is not a variable vcasync reads"
        elif words[0] in FOREIGN:
            continue
        else:
            raise AssertionError(f"{command!r}: no test knows this command; add it to check_shell_line")


def _shell_lines() -> list[tuple[str, str]]:
    """``(page:line, command)`` for each command of the pages' shell blocks; ``\\`` continues a line."""
    out = []
    for page in SHELL_PAGES:
        for code, line in _blocks(page, "sh", "console"):
            pending, start = "", 0
            for i, text in enumerate(code.splitlines()):
                text = text.removeprefix("$ ")
                if not pending and (not text.strip() or text.startswith((" ", "#"))):
                    continue
                start = start if pending else i
                pending += text.rstrip().removesuffix("\\") + " "
                if not text.rstrip().endswith("\\"):
                    out.append((f"{page.name}:{line + 1 + start}", pending.strip()))
                    pending = ""
    return out


@pytest.mark.parametrize(("where", "line"), _shell_lines(), ids=[w for w, _ in _shell_lines()])
def test_shell_line_is_a_command_we_accept(where: str, line: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    check_shell_line(line, build_parser(available_commands()))


def test_shell_line_check_catches_mistakes() -> None:
    parser = build_parser(available_commands())
    for bad in ("vcasync coordinator --no-such-flag", 'pip install ".[nonesuch]"', "tox -e nonesuch",
                "export VCASYNC_NO_SUCH=1", "frobnicate", "python -m vcasync coordinator --no-such-flag",
                "python -m bench.convergence --no-such-flag", "python -m bench.convergence --seeds -1",
                "python -m bench.publish --only codec", "python -m bench.nonesuch --json"):
        with pytest.raises(AssertionError):
            check_shell_line(bad, parser)
    check_shell_line("vcasync worker --coordinator http://h:1 --trainer a.b:c --state-dir /x", parser)
    check_shell_line("python -m vcasync worker --coordinator http://h:1 --trainer a.b:c --state-dir /x",
                     parser)
    check_shell_line("python -m bench.convergence --quick --json && python -m bench.publish --check", parser)
    check_shell_line("python -m bench.codec --help", parser)
    check_shell_line("python -m pytest tests/docs", parser)      # another program's: not checked


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    blocks = _blocks(ROOT / "README.md", "python")
    assert len(blocks) >= 2
    for code, line in blocks:
        exec(compile(code, f"README.md:{line}", "exec"), namespace)
    assert "16 units merged, model v16" in capsys.readouterr().out


def test_readme_run_toml_is_what_its_coordinator_command_accepts(tmp_path: Path) -> None:
    """The README's ``vcasync coordinator --config run.toml`` with the run.toml it shows: parsed,
    validated and built as the command builds it (model, units, policy, coordinator config)."""
    from vcasync import CoordinatorConfig, build_policy
    from vcasync._imports import import_object
    from vcasync.runconfig import dataclass_from_table, load_run_config

    tomls = [code for code, _ in _blocks(ROOT / "README.md", "toml") if "# run.toml" in code]
    assert len(tomls) == 1
    (tmp_path / "run.toml").write_text(tomls[0])
    line = next(text for _, text in _shell_lines() if text.startswith("vcasync coordinator --config"))
    args = build_parser(available_commands()).parse_args(shlex.split(line, comments=True)[1:])
    cfg = load_run_config(tmp_path / args.config.name)
    assert import_object(cfg.model, what="model factory")().state_dict()
    assert len(cfg.units.build()) == 8 * 10
    build_policy(cfg.policy["name"], cfg.policy.get("params"))
    dataclass_from_table(CoordinatorConfig, cfg.coordinator, "coordinator")
    assert cfg.server.port == 8470


def _anchors(page: Path) -> set[str]:
    """The heading ids the site gives ``page`` (mkdocs' ``toc`` slugs; the site build checks the
    docs pages' own links and anchors, but the README is not one of its pages)."""
    from markdown.extensions.toc import slugify

    text = FENCE.sub("", page.read_text())
    return {slugify(h, "-") for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


def readme_link_problems(readme: Path) -> list[str]:
    """Links ``[text](target)`` and backquoted repository paths (``docs/x.md``) of ``readme`` that
    name no file of the repository, or an anchor its page does not have."""
    text = FENCE.sub("", readme.read_text())
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        page = readme.parent / path if path else readme
        if not page.exists():
            problems.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(page):
            problems.append(f"{target}: {path or readme.name} has no heading #{anchor}")
    for path in re.findall(r"`((?:docs|bench|tests|harness|deploy|tools|examples)/[\w./-]+\.(?:md|py|json))`",
                           text):
        if not (readme.parent / path).exists():
            problems.append(f"`{path}`: no such file")
    return problems


def test_readme_links_and_paths_exist() -> None:
    assert readme_link_problems(ROOT / "README.md") == []


def test_readme_link_check_catches_mistakes(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Some part\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#some-part) [ext](https://example.com/x) `docs/a.md`\n"
        "[gone](docs/b.md) [bad](docs/a.md#nonesuch) `docs/c.md`\n")
    assert readme_link_problems(tmp_path / "README.md") == [
        "docs/b.md: no such file", "docs/a.md#nonesuch: docs/a.md has no heading #nonesuch",
        "`docs/c.md`: no such file"]
