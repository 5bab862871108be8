"""The command line that starts a vcasync module in a child interpreter."""

from __future__ import annotations

import sys

__all__ = ["module_command"]


def module_command(module: str, *args: str, python: str = sys.executable) -> list[str]:
    """``python -P -m module args...``.

    ``-P`` keeps the working directory off ``sys.path``: run from a source checkout (the README's
    ``pip install . && vcasync demo``), plain ``-m`` would import the checkout's ``vcasync/`` folder
    instead of the installed package, and that folder lacks ``vcasync.plugins`` and
    ``vcasync.backends``, which are installed from ``plugins/`` and ``backends/``. A project's own
    modules are still found: the commands put ``--app-dir`` (default ``.``) on ``sys.path`` themselves.
    """
    return [python, "-P", "-m", module, *args]
