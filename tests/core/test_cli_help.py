"""``vcasync --help`` and every subcommand's help are plain text a terminal user can read."""

from __future__ import annotations

import argparse
import re

import pytest

from vcasync.cli import ExitCode, available_commands, build_parser

MARKUP = re.compile(r"``|:(class|func|mod|meth|attr|data|exc):`")


def _helps() -> dict[str, str]:
    parser = build_parser(available_commands())
    out = {"vcasync": parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update({name: sub.format_help() for name, sub in action.choices.items()})
    return out


@pytest.mark.parametrize("name", sorted(_helps()))
def test_help_is_plain_text(name: str) -> None:
    text = _helps()[name]
    assert not MARKUP.search(text), f"reStructuredText markup in '{name} --help':\n{text}"


def test_top_level_help_names_every_exit_status() -> None:
    text = " ".join(_helps()["vcasync"].split())
    for code in ExitCode:
        assert f"{int(code)} {code.name.lower()}" in text
