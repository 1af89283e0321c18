"""The ``streamrec`` command line: ``ls``, ``count``, ``verify``, ``head``, ``inspect``,
``index``, ``reshard``, ``cleanup`` and ``probe``.

Each subcommand lives in a module of ``streamrec.cli`` exposing ``register(commands)``, which adds
its parser and stores its handler with ``set_defaults(run=handler)``; a handler takes the parsed
arguments and returns the exit status. :func:`main` parses, dispatches and turns the errors a
user can cause (:class:`~streamrec.errors.StreamrecError`) into one line on stderr and exit
status 1. Usage errors exit with status 2 (argparse). While a command runs, the ``streamrec``
logger writes to stderr: retries as warnings, and with ``-v`` every storage request with its
time and the command's total time.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence

from streamrec._version import __version__
from streamrec.cli import convert, count, head, index, inspect, ls, reshard
from streamrec.cli.common import EXIT_DATA_ERROR, error
from streamrec.cli.store import cleanup, probe
from streamrec.errors import StreamrecError
from streamrec.format import accel

__all__ = ["build_parser", "main"]

EPILOG = """\
Urls may be local paths, globs, directories, manifests, file://, s3://, gs://, az:// (abfs://),
http(s):// or memory:// urls. Every command takes --json (one JSON document on stdout),
--storage-options JSON (passed to fsspec: endpoint, credentials), --no-progress, -v/--verbose
(every storage request with its time, retries, the total time) and --timeout SECONDS (how long
one storage request attempt may go unanswered before it is retried; default 30, at most 6
attempts);
`streamrec COMMAND --help` shows its output and examples.
Retries are logged on stderr as warnings. `streamrec --version` says whether the C
accelerators are in use.

exit status: 0 ok; 1 damaged data, missing objects or storage errors; 2 usage error

examples:
  streamrec ls 'data/train-*.tfrecord'
  streamrec verify 'gs://bucket/train-*.tfrecord.gz'
  streamrec head -n 2 --decode data/train-00000.tfrecord
  streamrec inspect 's3://bucket/train-*' --storage-options '{"anon": true}'
  streamrec index 'data/train-*.tfrecord'          # SHARD.idx beside each: len(ds) without reading
  streamrec probe 's3://bucket/train/'             # measure the store; settings to use
"""

Handler = Callable[[argparse.Namespace], int]
logger = logging.getLogger("streamrec")


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
    parser.add_argument(
        "--version",
        action="version",
        version=f"streamrec {__version__}\n{accel.describe()}",
        help="show the version and whether the C accelerators are in use, and exit",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in (ls, count, head, inspect, index, reshard, convert, cleanup, probe):
        module.register(commands)
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


def main(argv: Sequence[str | os.PathLike[str]] | None = None) -> int:
    """Entry point of the ``streamrec`` console script; returns the exit status. ``argv``
    (default ``sys.argv[1:]``) may hold ``pathlib.Path`` objects too."""
    parser = build_parser()
    args = parser.parse_args(None if argv is None else [os.fspath(a) for a in argv])
    handler: Handler | None = getattr(args, "run", None)
    if handler is None:
        parser.print_help()
        return 0
    with _logging_to_stderr(verbose=getattr(args, "verbose", False)):
        return _run(handler, args)


def _run(handler: Handler, args: argparse.Namespace) -> int:
    """Run the handler; user errors become one line on stderr and an exit status."""
    started = time.monotonic()
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
    finally:
        logger.info("%s took %.3f s", args.command, time.monotonic() - started)


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"streamrec: {record.levelname.lower()}: {record.getMessage()}"


@contextlib.contextmanager
def _logging_to_stderr(*, verbose: bool) -> Iterator[None]:
    """The ``streamrec`` logger on stderr while a command runs: warnings (retries), or
    everything with ``-v``; as it was afterwards (``main`` may run inside a process)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    saved = logger.handlers, logger.propagate, logger.level
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING)
    try:
        yield
    finally:
        logger.handlers, logger.propagate = saved[0], saved[1]
        logger.setLevel(saved[2])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
