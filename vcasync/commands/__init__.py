"""Subcommands of ``vcasync``: every module here that defines ``COMMAND`` (a :class:`vcasync.cli.Command`)
is one. Add a module to add a command."""
