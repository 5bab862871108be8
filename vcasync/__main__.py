"""``python -m vcasync``: the same as the ``vcasync`` command."""

from .cli import console

console()
