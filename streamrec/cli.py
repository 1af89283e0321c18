"""The ``streamrec`` command line: ``ls``, ``count``, ``verify``, ``head``, ``inspect`` (and
``reshard`` when :mod:`streamrec.cli_reshard` is present).

Each subcommand lives in a ``streamrec.cli_*`` module exposing ``register(commands)``, which adds
its parser and stores its handler with ``set_defaults(run=handler)``; a handler takes the parsed
arguments and returns the exit status. :func:`main` parses, dispatches and turns the errors a
user can cause (:class:`~streamrec.errors.StreamrecError`) into one line on stderr and exit
status 1. Usage errors exit with status 2 (argparse).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
from collections.abc import Callable, Sequence

import streamrec
from streamrec import cli_cleanup, cli_count, cli_head, cli_inspect, cli_ls
from streamrec.cli_common import EXIT_DATA_ERROR, error
from streamrec.errors import StreamrecError

__all__ = ["build_parser", "main"]

EPILOG = """\
Urls may be local paths, globs, file://, s3://, gs://, http(s):// or memory:// urls. Every
command takes --json (one JSON document on stdout), --storage-options JSON (passed to fsspec:
endpoint, credentials) and --no-progress; `streamrec COMMAND --help` shows its output and
examples.

exit status: 0 ok; 1 damaged data, missing objects or storage errors; 2 usage error

examples:
  streamrec ls 'data/train-*.tfrecord'
  streamrec verify 'gs://bucket/train-*.tfrecord.gz'
  streamrec head -n 2 --decode data/train-00000.tfrecord
  streamrec inspect 's3://bucket/train-*' --storage-options '{"anon": true}'
"""

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The ``streamrec`` argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="streamrec",
        description=textwrap.fill(
            "Inspect and check TFRecord shards on local disk or in object stores, without "
            "TensorFlow. Every record's CRCs are verified.",
            92,
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"streamrec {streamrec.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (cli_ls, cli_count, cli_head, cli_inspect, cli_cleanup):
        module.register(commands)
    try:  # written separately; the other commands work without it
        reshard = importlib.import_module("streamrec.cli_reshard")
    except ImportError:
        pass
    else:
        reshard.register(commands)
    return parser


def _silence_stdout() -> None:
    """After a broken pipe (``streamrec head ... | head -1``), drop further output quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (tests capturing it)
        pass
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``streamrec`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "run", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        return handler(args)
    except StreamrecError as exc:
        error(exc)
        return EXIT_DATA_ERROR
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_DATA_ERROR
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
