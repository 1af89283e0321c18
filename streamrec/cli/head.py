"""``streamrec head``: the first records of a set of shards, raw or decoded."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from contextlib import aclosing
from typing import Any

from streamrec.cli.common import (
    EXIT_DATA_ERROR,
    EXIT_OK,
    Commands,
    add_command,
    add_common_arguments,
    add_prefetch_argument,
    cli_text,
    error,
    non_negative_int,
    print_json,
    read_options_of,
)
from streamrec.errors import ExampleError, StreamrecError
from streamrec.format.inspect import DEFAULT_MAX_INLINE_BYTES, render_payload
from streamrec.pipeline.stream.scan import Located, ShardScan

__all__ = ["compact_json", "preview", "register", "run"]

PREVIEW_BYTES = 16

EPILOG = f"""\
output: records in reading order across the shards, grouped under '==> url <=='. Without
--decode, one line per record: its index in the shard, the byte offset of its header (in the
uncompressed stream), payload length, the first 16 hex digits of the payload's sha256 and its
first {PREVIEW_BYTES} bytes (hex and printable). With --decode, each record as JSON: an Example
as {{"features": {{name: {{"int64_list": [...]}} | {{"float_list": [...], "float_list_hex":
[...]}} | {{"bytes_list": [base64, ...]}}}}}}, a SequenceExample as {{"context", "feature_lists"}};
bytes values longer than --max-inline-bytes as {{"length", "sha256"}}. Whether a payload is an
Example, a SequenceExample (it has feature_lists) or neither (raw) is guessed; --kind forces it.

examples:
  streamrec head 'data/train-*.tfrecord'
  streamrec head -n 1 --decode data/train-00000.tfrecord
  streamrec head -n 100 --decode --json 'gs://bucket/train-*' | jq '.records[].example'

--json: {{"records": [{{"url", "index", "offset", "length", "sha256", "head_hex",
         and with --decode "kind" and "example" | "sequence_example"}}], "error"}}
exit status: 0 ok; 1 damaged data before N records (the records before it are printed) or a
missing object; 2 usage error
"""


def register(commands: Commands) -> None:
    """Add the ``head`` subcommand."""
    parser = add_command(
        commands,
        "head",
        summary="show the first records, raw or decoded as Example JSON",
        description=(
            "Show the first N records of TFRecord shards: length, sha256 and a preview of "
            "each payload, or with --decode the Example / SequenceExample as JSON."
        ),
        epilog=EPILOG,
    )
    add_common_arguments(parser)
    add_prefetch_argument(parser)
    parser.add_argument(
        "-n",
        "--records",
        type=non_negative_int,
        default=5,
        metavar="N",
        help="how many records, across all shards (default: 5)",
    )
    parser.add_argument(
        "--decode", action="store_true", help="decode each payload as an Example (JSON)"
    )
    parser.add_argument(
        "--kind",
        choices=["auto", "example", "sequence_example", "raw"],
        default="auto",
        help="payload type for --decode (default: auto, guessed per record)",
    )
    parser.add_argument(
        "--max-inline-bytes",
        type=non_negative_int,
        default=DEFAULT_MAX_INLINE_BYTES,
        metavar="N",
        help="bytes values longer than N show as {length, sha256} "
        f"(default: {DEFAULT_MAX_INLINE_BYTES})",
    )
    parser.set_defaults(run=run)


def preview(payload: bytes) -> str:
    """The first bytes of ``payload`` as hex and as printable ASCII (``.`` for the rest)."""
    head = payload[:PREVIEW_BYTES]
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in head)
    more = "..." if len(payload) > PREVIEW_BYTES else ""
    return f"{head.hex():<{2 * PREVIEW_BYTES}}  |{text}|{more}"


class _Renderer:
    """Turns located records into documents; remembers per shard whether it holds sequences."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._sequence_shard: str | None = None

    def document(self, record: Located) -> dict[str, Any]:
        shard, index, offset, payload = record
        document: dict[str, Any] = {
            "url": shard.url,
            "index": index,
            "offset": offset,
            "length": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "head_hex": payload[:PREVIEW_BYTES].hex(),
        }
        if self.args.decode:
            try:
                kind, rendering = render_payload(
                    payload,
                    kind=self.args.kind,
                    prefer_sequence=self._sequence_shard == shard.url,
                    max_inline_bytes=self.args.max_inline_bytes,
                )
            except ExampleError as exc:
                raise ExampleError(
                    f"record {index} in {shard.url} at byte offset {offset}: {exc}"
                ) from exc
            if kind == "sequence_example":
                self._sequence_shard = shard.url
            document["kind"] = kind
            if rendering is not None:
                document[kind] = rendering
        return document


def compact_json(value: object, indent: int = 0, width: int = 100) -> str:
    """JSON with containers on one line when they fit in ``width`` columns, else expanded."""
    flat = json.dumps(value, ensure_ascii=False)
    if not isinstance(value, (dict, list)) or not value or indent + len(flat) <= width:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [
            f"{pad}{json.dumps(k, ensure_ascii=False)}: {compact_json(v, indent + 2, width)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if all(not isinstance(v, (dict, list)) for v in value):
        items = _packed([json.dumps(v, ensure_ascii=False) for v in value], pad, width)
    else:
        items = [pad + compact_json(v, indent + 2, width) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def _packed(words: list[str], pad: str, width: int) -> list[str]:
    """``words`` joined by ", " into lines of at most ``width`` columns (one word at least)."""
    lines: list[str] = []
    line = ""
    for word in words:
        if line and len(pad) + len(line) + len(word) + 3 > width:
            lines.append(pad + line)
            line = ""
        line = f"{line}, {word}" if line else word
    lines.append(pad + line)
    return lines


def _print_record(document: dict[str, Any], payload: bytes, decode: bool) -> None:
    if not decode:
        print(
            f"{document['index']:>6} {document['offset']:>12} {document['length']:>10}  "
            f"{document['sha256'][:16]}  {preview(payload)}"
        )
        return
    print(
        f"record {document['index']} at byte offset {document['offset']}: "
        f"{document['length']} bytes, sha256 {document['sha256']}, {document['kind']}"
    )
    kind = document["kind"]
    if kind in document:
        print(compact_json(document[kind]))
    else:
        print(f"  {preview(payload)}")


async def _head(args: argparse.Namespace, found: list[dict[str, Any]]) -> None:
    """Read the first ``args.records`` records into ``found`` (printing them unless --json)."""
    if args.records == 0:
        return
    renderer = _Renderer(args)
    current: str | None = None
    async with ShardScan(read_options_of(args)) as scan:
        shards = await scan.list_shards(args.urls)
        async with aclosing(scan.located(shards)) as located:
            async for record in located:
                document = renderer.document(record)
                found.append(document)
                if not args.json:
                    if record[0].url != current:
                        current = record[0].url
                        _print_group(current, args.decode, first=len(found) == 1)
                    _print_record(document, record[3], args.decode)
                if len(found) >= args.records:
                    return


def _print_group(url: str, decode: bool, *, first: bool) -> None:
    if not first:
        print()
    print(f"==> {url} <==")
    if not decode:
        print(f"{'index':>6} {'offset':>12} {'length':>10}  {'sha256[:16]':<16}  preview")


def run(args: argparse.Namespace) -> int:
    """Print the first records."""
    found: list[dict[str, Any]] = []
    failure: StreamrecError | None = None
    try:
        asyncio.run(_head(args, found))
    except StreamrecError as exc:
        if not found:
            raise
        failure = exc
    if args.json:
        print_json({"records": found, "error": None if failure is None else cli_text(failure)})
    if failure is not None:
        error(failure)
        return EXIT_DATA_ERROR
    return EXIT_OK
