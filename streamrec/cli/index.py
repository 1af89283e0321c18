"""``streamrec index``: write a record index sidecar (``<shard>.idx``) beside existing shards.

Each shard is read once from its start, streamed like ``count`` reads it (every CRC checked,
never the whole shard in memory), and the framed length of each record collected; the index
(:mod:`streamrec.format.index.core`) is written only once the shard has been read to its end
without damage, through the store's sink (:meth:`~streamrec.storage.base.ObjectStore.
open_sink`: a temporary file renamed into place, one S3 PUT, a GCS upload), so a reader never
sees half an index. Shards run ``--concurrency`` at a time over one prefetch budget.

Once every shard has an index (written or kept), their entries are also written as one
dataset index, ``_dataset_index.bin`` in the shards' common directory
(:mod:`streamrec.format.index.dataset`): readers fetch that one object instead of a sidecar
per shard. ``--no-dataset-index`` leaves it out.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamrec._portal import run_all
from streamrec.cli.common import (
    EXIT_DATA_ERROR,
    EXIT_OK,
    Commands,
    Progress,
    add_command,
    add_common_arguments,
    add_prefetch_argument,
    cli_text,
    error,
    plural,
    positive_int,
    print_json,
    read_options_of,
)
from streamrec.errors import (
    FormatError,
    IndexMismatchError,
    ObjectNotFoundError,
    StreamrecError,
)
from streamrec.format.codecs import Compression
from streamrec.format.framing import OVERHEAD_BYTES
from streamrec.format.index.core import ShardIndex, index_url
from streamrec.format.index.dataset import (
    DATASET_INDEX_NAME,
    EncodedShard,
    dataset_index_bytes,
    encode_shard,
)
from streamrec.pipeline.listing.dataset_index import dataset_index_url
from streamrec.pipeline.listing.sidecars import find_indexes, load_index
from streamrec.pipeline.stream.scan import ShardScan
from streamrec.storage.registry import ObjectInfo
from streamrec.storage.sink_base import SinkContext

__all__ = ["COUNTS_ONLY", "IndexResult", "build_index", "index_shards", "register", "run"]

COUNTS_ONLY = (
    "compressed: counts only, no random access; rewrite with `streamrec reshard --index` for "
    "random access"
)
"""What a plain index of a GZIP/ZLIB shard gives (said in the summary and in --help)."""

DESCRIPTION = """\
Write a record index beside each TFRecord shard: SHARD.idx, one line "<offset> <length>" per
record (the byte offset of its 12-byte header and its framed length, payload + 16). It is the
format DALI's tfrecord2idx and the tfrecord package's create_index write, so their indexed
readers can use it too; streamrec uses it for len(ds) and ds.num_records without reading the
shards. Every shard is read once, streamed, with every CRC checked: a damaged shard gets no
index (the error names the file and the byte offset). Each index appears complete or not at
all. Listing inputs skips .idx names (like _ and . names), so 'data/*' means the shards only.
Once every shard is indexed, the same entries go into one dataset index, _dataset_index.bin
in the shards' common directory: readers (len, get, shuffle="global"/"block", even) then
fetch one object, once per host, instead of a sidecar per shard. It describes the shards
indexed by this run: index the whole dataset at once (data/, not data/train-*)."""

EPILOG = """\
which shards: those the urls stand for, as for every command. A shard whose index is present
and valid for the shard as it is now is skipped (--force rebuilds it); an index that does not
fit its shard (stale: the shard was rewritten) is replaced.

GZIP/ZLIB shards get a plain index of offsets in the decompressed stream:
"compressed: counts only, no random access" (no reader can seek into a compressed stream by
it); rewrite them with `streamrec reshard --index` for random access.
A compressed shard's valid random-access index (written with restart points by streamrec's
writer) is never replaced by a counts-only one, not even with --force, while its records
agree with the shard.

output: one line per shard (INDEXED / SKIPPED / FAILED, records, url, index url), a summary.

examples:
  streamrec index 'data/train-*.tfrecord'
  streamrec index data/ --force --concurrency 16
  streamrec index 's3://bucket/train/*' --storage-options \\
      '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}'
  streamrec index 'gs://bucket/train-*.tfrecord.gz' --json | jq .total_records

--json: {"shards": [{"url", "size", "compression", "records", "index", "index_bytes", "action"
         ("indexed" | "skipped" | "failed"), "random_access", "note", "error"}],
         "num_shards", "indexed", "skipped", "failed", "total_records", "complete"}
exit status: 0 every shard indexed or skipped; 1 a damaged or unreadable shard, or an index
that could not be written (the others are still indexed); 2 usage error
"""


def register(commands: Commands) -> None:
    """Add the ``index`` subcommand."""
    parser = add_command(
        commands,
        "index",
        summary="write a record index (SHARD.idx) beside each shard, for counts and seeking",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    add_common_arguments(parser)
    add_prefetch_argument(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="rebuild indexes that are present and valid too",
    )
    parser.add_argument(
        "--no-dataset-index",
        dest="dataset_index",
        action="store_false",
        help=f"write no dataset index ({DATASET_INDEX_NAME}: every shard's index in one object, "
        "which readers fetch instead of a sidecar per shard); written by default once every "
        "shard is indexed",
    )
    parser.add_argument(
        "--concurrency",
        type=positive_int,
        default=8,
        metavar="N",
        help="shards read and indexed at once (default: 8)",
    )
    parser.set_defaults(run=run)


@dataclass
class IndexResult:
    """What happened to one shard."""

    shard: ObjectInfo
    action: str = "failed"
    """``"indexed"`` (an index was written), ``"skipped"`` (a valid one is there) or
    ``"failed"`` (``error`` says why; no index was written)."""
    records: int | None = None
    compression: str | None = None
    random_access: bool | None = None
    index_bytes: int | None = None
    note: str | None = None
    error: StreamrecError | None = None
    encoded: EncodedShard | None = None
    """Its entries for the dataset index (a byte or two a record)."""

    @property
    def index(self) -> str:
        """The index's url."""
        return index_url(self.shard.url)


async def build_index(
    scan: ShardScan,
    shard: ObjectInfo,
    on_bytes: Callable[[int], None] | None = None,
    on_records: Callable[[int], None] | None = None,
) -> tuple[ShardIndex, Compression]:
    """Read ``shard`` (streamed, every CRC checked; damage raises) and return its plain index
    and the codec it was read with (an index of a compressed shard gives counts only).
    ``on_bytes(n)``: a block of n bytes was read; ``on_records(n)``: n more records."""
    reader = scan.shard(shard, lengths_only=True)
    lengths_of = reader.decoder.framing.lengths  # the scanner appends a block's lengths per call
    assert lengths_of is not None
    found = lengths_of
    reported = 0

    def on_block(size: int) -> None:  # progress: the records of the blocks before this one
        nonlocal reported
        if on_bytes is not None and size:
            on_bytes(size)
        if on_records is not None and len(found) > reported:
            on_records(len(found) - reported)
            reported = len(found)

    reader.on_bytes = on_block
    async with aclosing(reader.chunks()) as chunks:  # chunks are empty: lengths only
        async for _ in chunks:
            pass
    on_block(0)
    lengths = np.frombuffer(found, dtype=np.int64) + OVERHEAD_BYTES
    offsets = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1], out=offsets[1:])
    codec = reader.decoder.compression
    index = ShardIndex(offsets, lengths, counts_only=codec is not None)
    if codec is None and index.stream_bytes != shard.size:  # the decoder ensures it
        raise FormatError(
            f"records end at byte {index.stream_bytes} of {shard.size}", url=shard.url
        )
    return index, codec


async def _put(scan: ShardScan, url: str, data: bytes) -> None:
    """Make the object ``url`` hold ``data``, atomically (it appears complete or not at all)."""
    sink = scan.stores.get(url).open_sink(url, SinkContext(retry=scan.options.retry))
    try:
        await sink.write(data)
        await sink.commit()
    except BaseException:
        await sink.abort()
        raise


def _same_records(a: ShardIndex, b: ShardIndex) -> bool:
    return len(a) == len(b) and bool(np.array_equal(a.lengths, b.lengths))


@dataclass
class Indexed:
    """What ``streamrec index`` did: each shard's result, and the dataset index written."""

    results: list[IndexResult]
    dataset_index: str | None = None
    """The dataset index's url, when one was written (every shard indexed or kept)."""
    dataset_index_bytes: int = 0
    why_not: str | None = None
    """Why no dataset index was written."""


async def index_shards(args: argparse.Namespace) -> Indexed:
    """Index every shard the urls name, ``args.concurrency`` at a time (results in order),
    then write the dataset index of them all in their common directory."""
    async with ShardScan(read_options_of(args)) as scan:
        shards = await scan.list_shards(args.urls)
        results = await _index_each(args, scan, shards)
        return await _write_dataset_index(args, scan, shards, results)


async def _write_dataset_index(
    args: argparse.Namespace, scan: ShardScan, shards: list[ObjectInfo], results: list[IndexResult]
) -> Indexed:
    url = dataset_index_url(shards)
    if not args.dataset_index:
        return Indexed(results, why_not="--no-dataset-index")
    if url is None:
        return Indexed(results, why_not="one shard (its sidecar serves), or no common directory")
    if any(r.encoded is None for r in results):
        return Indexed(results, why_not="not every shard has an index")
    encoded = [r.encoded for r in results if r.encoded is not None]
    data = await asyncio.to_thread(dataset_index_bytes, encoded)
    await _put(scan, url, data)
    return Indexed(results, url, len(data))


async def _index_each(
    args: argparse.Namespace, scan: ShardScan, shards: list[ObjectInfo]
) -> list[IndexResult]:
    url = dataset_index_url(shards)
    directory = None if url is None else url[: -len(DATASET_INDEX_NAME)]
    retry = scan.options.retry
    sidecars = await find_indexes(shards, scan.stores.get, retry, concurrency=args.concurrency)
    total = sum(shard.size for shard in shards)
    records_seen = 0
    with Progress(args, total=total, unit="B", desc="index") as bar:

        def count_records(n: int) -> None:
            nonlocal records_seen
            records_seen += n
            bar.note(f"{records_seen:,} records")

        # a shard's slot is free once it is read: its index is written while the next
        # shard is read (a local sidecar's fsyncs take a few ms)
        reading = asyncio.Semaphore(args.concurrency)
        writing = asyncio.Semaphore(args.concurrency)

        async def one(shard: ObjectInfo, sidecar: ObjectInfo | None) -> IndexResult:
            result = IndexResult(shard)
            try:
                async with reading:
                    old, index, codec = await read(shard, sidecar)
                if index is None:
                    assert isinstance(old, ShardIndex) and sidecar is not None
                    encoded(result, old, codec)
                    return _described(result, "skipped", old, codec, sidecar.size)
                if (
                    isinstance(old, ShardIndex)
                    and old.random_access
                    and _same_records(old, index)
                    and sidecar is not None
                ):  # never replaced by a counts-only one
                    encoded(result, old, codec)
                    result.note = "its random-access index agrees with the shard: kept"
                    return _described(result, "skipped", old, codec, sidecar.size)
                async with writing:
                    data = await asyncio.to_thread(index.to_bytes)
                    await _put(scan, result.index, data)
                encoded(result, index, codec)
                _described(result, "indexed", index, codec, len(data))
                if isinstance(old, str):
                    result.note = f"replaced an index that did not fit the shard: {old}"
            except StreamrecError as exc:
                result.action, result.error = "failed", exc
            return result

        def encoded(result: IndexResult, index: ShardIndex, codec: Compression) -> None:
            shard = result.shard
            if directory is not None and shard.url.startswith(directory):
                name = shard.url[len(directory) :]
                result.encoded = encode_shard(name, shard.size, shard.version, codec, index)

        async def read(
            shard: ObjectInfo, sidecar: ObjectInfo | None
        ) -> tuple[ShardIndex | str | None, ShardIndex | None, Compression]:
            """The index there (str: why it does not fit), the shard's new index (None:
            the one there is valid and kept) and the shard's codec."""
            old: ShardIndex | str | None = None
            if sidecar is not None and not args.force:
                codec = await scan.compression(shard)
                old = await _existing(scan, shard, sidecar, codec)
                if isinstance(old, ShardIndex):
                    bar.update(shard.size)
                    return old, None, codec
            index, codec = await build_index(scan, shard, bar.update, count_records)
            if sidecar is not None and args.force and codec is not None:
                old = await _existing(scan, shard, sidecar, codec)
            return old, index, codec

        return await run_all(
            one(shard, sidecar) for shard, sidecar in zip(shards, sidecars, strict=True)
        )


async def _existing(
    scan: ShardScan, shard: ObjectInfo, sidecar: ObjectInfo, codec: Compression
) -> ShardIndex | str | None:
    """The valid index in ``sidecar``, or why it does not fit ``shard``; None when it is gone
    (a manifest named it)."""
    store, retry = scan.stores.get(sidecar.url), scan.options.retry
    try:
        return await load_index(shard, sidecar, store, retry, compressed=codec is not None)
    except ObjectNotFoundError:  # named by a manifest, removed since
        return None
    except IndexMismatchError as exc:
        return exc.problem


def _described(
    result: IndexResult, action: str, index: ShardIndex, codec: Compression, index_bytes: int
) -> IndexResult:
    result.action, result.records, result.index_bytes = action, len(index), index_bytes
    result.compression, result.random_access = codec or "none", index.random_access
    if not index.random_access:
        result.note = COUNTS_ONLY
    return result


# ------------------------------------------------------------------------------------ output


def run(args: argparse.Namespace) -> int:
    """Index every shard; print what was done."""
    indexed = asyncio.run(index_shards(args))
    results = indexed.results
    failed = [r for r in results if r.error is not None]
    if args.json:
        print_json(_document(indexed))
    else:
        _print(indexed)
    for result in failed:
        error(result.error)
    return EXIT_DATA_ERROR if failed else EXIT_OK


def _document(indexed: Indexed) -> dict[str, Any]:
    results = indexed.results
    shards = [
        {
            "url": r.shard.url,
            "size": r.shard.size,
            "compression": r.compression,
            "records": r.records,
            "index": r.index,
            "index_bytes": r.index_bytes,
            "action": r.action,
            "random_access": r.random_access,
            "note": r.note,
            "error": None if r.error is None else cli_text(r.error),
        }
        for r in results
    ]
    return {
        "shards": shards,
        "num_shards": len(results),
        **{action: _count(results, action) for action in ("indexed", "skipped", "failed")},
        "total_records": sum(r.records or 0 for r in results),
        "complete": all(r.error is None for r in results),
        "dataset_index": indexed.dataset_index,
        "dataset_index_bytes": indexed.dataset_index_bytes if indexed.dataset_index else None,
        "no_dataset_index": indexed.why_not,
    }


def _count(results: list[IndexResult], action: str) -> int:
    return sum(1 for r in results if r.action == action)


def _print(indexed: Indexed) -> None:
    results = indexed.results
    for r in results:
        records = "" if r.records is None else f"{r.records:,}"
        if r.action == "failed":
            line = f"FAILED   {records:>12}  {r.shard.url}  (no index written, see below)"
        elif r.action == "skipped":
            line = f"SKIPPED  {records:>12}  {r.shard.url}  (its index {r.index} is valid)"
        else:
            line = f"INDEXED  {records:>12}  {r.shard.url} -> {r.index}"
        if r.note:
            line += f"\n         {r.note}"
        print(line)
    summary = ", ".join(
        f"{_count(results, action)} {action}" for action in ("indexed", "skipped", "failed")
    )
    total = plural(sum(r.records or 0 for r in results), "record")
    print(f"{plural(len(results), 'shard')}: {summary}; {total}")
    if indexed.dataset_index is not None:
        print(f"dataset index: {indexed.dataset_index} ({indexed.dataset_index_bytes:,} bytes)")
    else:
        print(f"no dataset index written: {indexed.why_not}")
