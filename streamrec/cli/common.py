"""What every ``streamrec`` subcommand shares: common options, output helpers, progress bars.

A subcommand module exposes ``register(commands)``, which adds its parser with
:func:`add_command` and stores its handler with ``set_defaults(run=handler)``; a handler takes
the parsed arguments and returns the exit status (0 ok, 1 data error; argparse exits 2 on
usage errors by itself).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import textwrap
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar

from streamrec._portal import run_all
from streamrec.format.framing import OnCorrupt
from streamrec.pipeline.options import ReadOptions
from streamrec.storage.retry import RetryPolicy

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = [
    "EXIT_DATA_ERROR",
    "EXIT_OK",
    "Commands",
    "Progress",
    "add_command",
    "add_common_arguments",
    "add_prefetch_argument",
    "add_timeout_argument",
    "add_verbose_argument",
    "cli_text",
    "compression_of",
    "display_width",
    "error",
    "human_bytes",
    "map_bounded",
    "non_negative_int",
    "pad",
    "parse_bytes",
    "plural",
    "positive_int",
    "positive_float",
    "print_json",
    "read_options_of",
    "retry_of",
    "source_url",
    "storage_options_of",
]

T = TypeVar("T")
R = TypeVar("R")

EXIT_OK = 0
EXIT_DATA_ERROR = 1

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 1 << 10,
    "kib": 1 << 10,
    "mi": 1 << 20,
    "mib": 1 << 20,
    "gi": 1 << 30,
    "gib": 1 << 30,
    "ti": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)

URLS_HELP = (
    "local path, glob, directory or prefix, manifest (.json), file://, s3://, gs://, "
    "az:// (abfs://), http(s):// or memory:// url; globs are expanded and sorted by name, "
    "** at any depth, skipping names that start with _ or . and index sidecars (*.idx) "
    "(quote globs so the shell leaves them alone); a directory means its _manifest.json, "
    "else its files"
)


class Commands(Protocol):
    """What ``register(commands)`` is given: the object ``ArgumentParser.add_subparsers()``
    returns (argparse names its type only privately)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Add the subcommand ``name``; ``kwargs`` as for ``ArgumentParser``, plus ``help``."""
        ...


def add_command(
    commands: Commands,
    name: str,
    *,
    summary: str,
    description: str,
    epilog: str,
) -> argparse.ArgumentParser:
    """A subcommand parser whose ``--help`` keeps the description's and epilog's line breaks."""
    return commands.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, 92),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def json_object(text: str) -> dict[str, Any]:
    """argparse type: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, not {type(value).__name__}")
    return value


def source_url(text: str) -> str:
    """argparse type: a path or url of a scheme streamrec reads (others are usage errors)."""
    from streamrec.errors import StorageError
    from streamrec.storage.registry import store_key

    try:
        store_key(text)
    except StorageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be >= 1, not 0")
    return value


def parse_bytes(text: str) -> int:
    """A byte count from ``"1048576"``, ``"256MiB"``, ``"1GB"``, ``"1.5 GiB"`` (>= 1)."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"not a byte size: {text!r} (e.g. 1048576, 64KiB, 256MiB, 1GiB, 1GB)"
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte: {text!r}")
    return value


def add_common_arguments(
    parser: argparse.ArgumentParser, *, urls: bool = True, compression: bool = True
) -> None:
    """``URLS...``, ``--json``, ``--storage-options``, ``--no-progress``, ``-v``, ``--timeout``
    and ``--compression``."""
    if urls:
        parser.add_argument("urls", nargs="+", type=source_url, metavar="URL", help=URLS_HELP)
    parser.add_argument(
        "--json", action="store_true", help="print one JSON document on stdout instead of text"
    )
    parser.add_argument(
        "--storage-options",
        type=json_object,
        default=None,
        metavar="JSON",
        help=(
            "JSON object passed to the fsspec filesystem, e.g. "
            '\'{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}, "key": "..", '
            '"secret": ".."}\' for S3, \'{"token": "anon"}\' for GCS'
        ),
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is one on stderr only when stderr is a terminal)",
    )
    add_verbose_argument(parser)
    add_timeout_argument(parser)
    if compression:
        parser.add_argument(
            "--compression",
            default="auto",
            choices=["auto", "none", "gzip", "zlib"],
            help="codec of the files (default: auto, from the suffix, else the first bytes)",
        )


def add_prefetch_argument(parser: argparse.ArgumentParser) -> None:
    """``--prefetch-bytes SIZE``: the read-ahead budget of a command that reads records."""
    default = ReadOptions.prefetch_bytes  # open_dataset's default
    parser.add_argument(
        "--prefetch-bytes",
        type=parse_bytes,
        default=default,
        metavar="SIZE",
        help=(
            "most bytes read ahead and not yet decoded, all shards together, as open_dataset's "
            f"prefetch_bytes (default: {human_bytes(default)}; e.g. 256MiB)"
        ),
    )


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    """``-v/--verbose``: log retries, every storage request with its time, and the run's."""
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log every storage request with its time, retries and the total time on stderr",
    )


def add_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """``--timeout SECONDS``: the time one storage request attempt may take (every command)."""
    parser.add_argument(
        "--timeout",
        type=positive_float,
        metavar="SECONDS",
        help=(
            "seconds one storage request attempt may go without an answer before it is "
            "retried (default: 30; at most 6 attempts per request, each retry logged)"
        ),
    )


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {text}")
    return value


def retry_of(args: argparse.Namespace) -> RetryPolicy:
    """The storage retry policy, from ``--timeout`` (the time allowed to one attempt)."""
    timeout: float | None = getattr(args, "timeout", None)
    if timeout is None:
        return RetryPolicy()
    return RetryPolicy(timeout_s=timeout, deadline_s=max(RetryPolicy.deadline_s, timeout))


def read_options_of(args: argparse.Namespace, on_corrupt: OnCorrupt = "raise") -> ReadOptions:
    """How a command reads: its ``--compression``, ``--storage-options``, ``--timeout`` and
    ``--prefetch-bytes``, the rest as ``open_dataset``'s defaults."""
    return ReadOptions(
        compression=compression_of(args),
        on_corrupt=on_corrupt,
        prefetch_bytes=getattr(args, "prefetch_bytes", ReadOptions.prefetch_bytes),
        retry=retry_of(args),
        storage_options=storage_options_of(args),
    )


def compression_of(args: argparse.Namespace) -> str | None:
    """The ``compression=`` argument for the library, from ``--compression``."""
    choice: str = getattr(args, "compression", "auto")
    return None if choice == "none" else choice


def storage_options_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ``storage_options=`` argument for the library, from ``--storage-options``."""
    options: dict[str, Any] | None = args.storage_options
    return options


def print_json(document: object, out: TextIO | None = None) -> None:
    """Write ``document`` as one JSON document and a newline (stdout by default)."""
    stream = out or sys.stdout
    stream.write(json.dumps(document, indent=2) + "\n")


#: The library's hints, spelled as the commands' options (a user of the CLI cannot pass
#: ``compression=None``). ``streamrec reshard`` reads its inputs with compression "auto" (by
#: suffix, else by the first bytes): it has no option for them.
_ABSOLUTE_NAMES = (
    "pass allow_absolute_urls=True to trust this manifest",
    "the command line never follows such names: give the shards' urls instead",
)
_CLI_SPELLINGS = {
    "streamrec": (
        ("read it with compression=None", "read it with --compression none"),
        ("try compression='auto' or 'gzip'", "try --compression auto or gzip"),
        ("try compression='auto' or 'zlib'", "try --compression auto or zlib"),
        _ABSOLUTE_NAMES,
    ),
    "streamrec reshard": (
        (
            "read it with compression=None",
            "rename it without its .gz/.zz suffix: reshard picks an input's compression by "
            "its suffix, else by its first bytes",
        ),
        ("try compression='auto' or 'gzip'", "rename it with a .gz suffix"),
        ("try compression='auto' or 'zlib'", "rename it with a .zz suffix"),
        _ABSOLUTE_NAMES,
    ),
}


def cli_text(message: object, command: str = "streamrec") -> str:
    """``message`` (an error) with the library's hints in the command line's spelling."""
    text = str(message)
    for library, cli in _CLI_SPELLINGS.get(command, _CLI_SPELLINGS["streamrec"]):
        text = text.replace(library, cli)
    return text


def error(message: object, command: str = "streamrec") -> None:
    """One ``streamrec: error: ...`` line on stderr (``command`` names who speaks), its
    hints in the command line's spelling (:func:`cli_text`)."""
    print(f"{command}: error: {cli_text(message, command)}", file=sys.stderr)


def human_bytes(size: int) -> str:
    """``"1.5 MiB"``-style size (exact bytes below 1 KiB)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def plural(n: int, noun: str) -> str:
    """``"1 record"``, ``"2 records"``, ``"0 records"``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def display_width(text: str) -> int:
    """Terminal columns of ``text``: wide (CJK) characters take 2, combining marks 0."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def pad(text: str, width: int) -> str:
    """``text`` padded with spaces to ``width`` terminal columns (``str.ljust`` by columns)."""
    return text + " " * max(0, width - display_width(text))


class Progress:
    """A tqdm bar on stderr when stderr is a terminal (and not disabled), else nothing."""

    def __init__(
        self, args: argparse.Namespace, *, total: int | None, unit: str, desc: str
    ) -> None:
        self._bar: tqdm[Any] | None = None
        if getattr(args, "no_progress", False) or not sys.stderr.isatty():
            return
        from tqdm import tqdm

        scaled = unit == "B"
        self._bar = tqdm(
            total=total,
            unit=unit,
            unit_scale=scaled,
            unit_divisor=1024 if scaled else 1000,
            desc=desc,
            file=sys.stderr,
            leave=False,
            dynamic_ncols=True,
        )

    def update(self, n: int) -> None:
        """Advance the bar by ``n`` units."""
        if self._bar is not None:
            self._bar.update(n)

    def note(self, text: str) -> None:
        """Show ``text`` after the bar (e.g. a second counter), from the next refresh on."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        """Remove the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


async def map_bounded(items: Sequence[T], jobs: int, work: Callable[[T], Awaitable[R]]) -> list[R]:
    """``[await work(item) for item in items]``, at most ``jobs`` at a time, results in order."""
    gate = asyncio.Semaphore(jobs)

    async def one(item: T) -> R:
        async with gate:
            return await work(item)

    return await run_all(one(item) for item in items)
