"""``python -m vcasync``: the same as the ``vcasync`` command."""

from .cli import main

raise SystemExit(main())
