"""``vcasync --help`` and every subcommand's help are plain text a terminal user can read."""

from __future__ import annotations

import argparse
import re

import pytest

from vcasync.cli import ExitCode, available_commands, build_parser

MARKUP = re.compile(r"``|:(class|func|mod|meth|attr|data|exc):`")


def _helps() -> dict[str, str]:
    """``--help`` of ``vcasync`` and of every subcommand, nested ones (``ray up``) included."""
    out: dict[str, str] = {}

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out[name] = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub_name if name == "vcasync" else f"{name} {sub_name}", sub)

    walk("vcasync", build_parser(available_commands()))
    return out


@pytest.mark.parametrize("name", sorted(_helps()))
def test_help_is_plain_text(name: str) -> None:
    text = _helps()[name]
    assert not MARKUP.search(text), f"reStructuredText markup in '{name} --help':\n{text}"


def test_nested_subcommands_are_checked_too() -> None:
    assert {"ray up", "ray scale", "ray status", "ray down"} <= set(_helps())


def test_top_level_help_names_every_exit_status() -> None:
    text = " ".join(_helps()["vcasync"].split())
    for code in ExitCode:
        assert f"{int(code)} {code.name.lower()}" in text


ENV_READ = re.compile(
    r"""(?:environ\.get|getenv|environ\[|read_secret)\(?\s*["']([A-Z][A-Z0-9_]*)["']""")
#: Where the ``vcasync`` commands read the environment: the CLI, its commands and launchers, and the
#: storage backends they open (``vcasync.testing`` is not a command: its variables are test switches).
CLI_SOURCES = ("vcasync/cli.py", "vcasync/commands", "vcasync/launch", "vcasync/demo", "vcasync/sim",
               "backends")


def _read_variables() -> dict[str, str]:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found: dict[str, str] = {}
    for where in CLI_SOURCES:
        path = root / where
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            for var in ENV_READ.findall(file.read_text()):
                found.setdefault(var, str(file.relative_to(root)))
    return found


def test_every_environment_variable_the_cli_reads_is_in_some_help() -> None:
    """Grepped from the source, not from the registry: a variable read without being documented
    in :data:`vcasync.cli.ENVIRONMENT` (and so in ``--help``) fails here."""
    read = _read_variables()
    assert {"VCASYNC_JOIN_SECRET", "VCASYNC_OPERATOR_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS"} <= set(read)
    helps = " ".join(_helps().values())
    missing = {var: file for var, file in read.items() if var not in helps}
    assert not missing, f"environment variables read but not in any --help: {missing}"


def test_the_variable_pattern_finds_each_way_of_reading() -> None:
    src = ('os.environ.get("A_B") os.getenv(\'C\') os.environ["D_1"] read_secret("E", f, what="x") '
           'os.environ.get("lower")')
    assert ENV_READ.findall(src) == ["A_B", "C", "D_1", "E"]


def test_coordinator_help_lists_the_installed_policies_and_schemes() -> None:
    """From the registries at the time --help runs: a policy a plugin registers shows up."""
    from vcasync.plugins.vcasgd import VCASGD

    from vcasync import available_backends, available_policies, register_policy, unregister_policy

    class DocsHelpPolicy(VCASGD):
        name = "docs_help_policy"

    register_policy("docs_help_policy", DocsHelpPolicy)
    try:
        text = " ".join(_helps()["coordinator"].split())
    finally:
        unregister_policy("docs_help_policy")
    for name in [*available_policies(), "docs_help_policy"]:
        assert re.search(rf"merge policies installed .*\b{name}\b", text), name
    for scheme in available_backends():
        assert f"{scheme}://," in text or f"{scheme}:// " in text, scheme


def test_join_secret_help_states_the_minimum_the_coordinator_enforces() -> None:
    from vcasync import TokenAuthority
    from vcasync.errors import ConfigError

    with pytest.raises(ConfigError, match="too short"):
        TokenAuthority(join_secret="x" * 15)
    TokenAuthority(join_secret="x" * 16)
    for name in ("coordinator", "worker"):
        assert "at least 16 characters" in " ".join(_helps()[name].split())


@pytest.mark.parametrize(("error", "code", "said"), [
    ("ConfigError", ExitCode.CONFIG, "configuration error: bad"),
    ("UnknownPolicyError", ExitCode.CONFIG, "configuration error: bad"),
    ("RunIncompleteError", ExitCode.INCOMPLETE, "incomplete: bad"),
    ("StorageFailedError", ExitCode.STORAGE, "storage error: bad"),
    ("CorruptObjectError", ExitCode.STORAGE, "storage error: bad"),
    ("BackendUnavailableError", ExitCode.CONFIG, "configuration error: bad"),
    ("VCAsyncError", ExitCode.ERROR, "VCAsyncError: bad"),
    ("TrainerError", ExitCode.ERROR, "TrainerError: bad"),     # a worker that delivered nothing
])
def test_an_error_that_ends_a_command_maps_to_its_exit_status(
        error: str, code: ExitCode, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    # a run stopped at its time limit was exit 2 ("the configuration is wrong; nothing was changed")
    import vcasync.errors
    from vcasync.cli import Command, main

    def fail(_: argparse.Namespace) -> int:
        raise getattr(vcasync.errors, error)("bad")

    cmd = Command("boom", "fails", lambda p: None, fail)
    assert main(["boom"], commands={"boom": cmd}) == code
    assert capsys.readouterr().err.strip() == f"vcasync boom: {said}"
