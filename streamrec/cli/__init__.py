"""The ``streamrec`` command line: one module per subcommand, ``main`` in :mod:`.main`."""

from streamrec.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
