"""What a new user hits in the first hour (issue 29, A.5): paths as ``pathlib.Path``, bad
arguments named up front, the CLI's own spellings and options, messages that say enough."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamrec
from integration.test_cli import cli, write_records
from streamrec.cli.main import main
from streamrec.errors import ArgumentError
from streamrec.example import FixedLenFeature, decode_batch, encode
from streamrec.format.index.core import index_url
from support.fault_proxy import FaultProxy
from support.server_fixtures import HttpDir
from support.servers import MotoS3Server

# ------------------------------------------------------------------ os.PathLike everywhere


def test_open_dataset_takes_pathlib_paths_alone_and_in_lists(tmp_path: Path) -> None:
    first = write_records(tmp_path / "a.tfrecord", [b"a0", b"a1"])
    second = write_records(tmp_path / "b.tfrecord", [b"b0"])
    # was: TypeError: 'PosixPath' object is not iterable
    assert list(streamrec.open_dataset(first)) == [b"a0", b"a1"]
    assert list(streamrec.open_dataset([second, str(first)])) == [b"b0", b"a0", b"a1"]
    assert list(streamrec.open_dataset(tmp_path)) == [b"a0", b"a1", b"b0"]  # a directory
    assert streamrec.open_dataset(first).urls == [str(first)]
    assert list(streamrec.open_dataset(p for p in (second, first))) == [b"b0", b"a0", b"a1"]


def test_writers_manifests_and_indexes_take_pathlib_paths(tmp_path: Path) -> None:
    template = tmp_path / "out" / "part-{index:02d}.tfrecord"
    (tmp_path / "out").mkdir()
    with streamrec.sync.open_writer(template, max_records=2, index=True) as w:
        w.write_many([b"x", b"y", b"z"])
    assert w.url == str(template)

    async def write_async() -> None:
        async with streamrec.open_writer(tmp_path / "one.tfrecord") as writer:
            await writer.write(b"one")

    asyncio.run(write_async())
    assert list(streamrec.open_dataset(tmp_path / "one.tfrecord")) == [b"one"]
    manifest = tmp_path / "out" / "_manifest.json"
    entries = asyncio.run(streamrec.read_manifest(manifest))
    assert [e.records for e in entries] == [2, 1]
    assert index_url(tmp_path / "out" / "part-00.tfrecord") == entries[0].index_url
    assert len(streamrec.open_dataset(manifest)) == 3
    cache = tmp_path / "cache"
    ds = streamrec.open_dataset(manifest, cache_dir=cache, cache_bytes=1 << 20)
    assert ds.options.cache_dir == str(cache)


def test_the_cli_entry_points_take_pathlib_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = write_records(tmp_path / "a.tfrecord", [b"a0", b"a1"])
    assert main(["count", shard, "--json"]) == 0
    assert '"records": 2' in capsys.readouterr().out
    from streamrec.cli.reshard import main as reshard_main

    out = tmp_path / "re" / "part-{index:02d}.tfrecord"
    assert reshard_main([shard, out, "--no-progress", "--json"]) == 0
    assert list(streamrec.open_dataset(tmp_path / "re")) == [b"a0", b"a1"]


def test_a_path_of_another_type_names_the_argument() -> None:
    with pytest.raises(ArgumentError, match=r"^urls must be a path or url .* not bytes"):
        streamrec.open_dataset(b"/data/x.tfrecord")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match=r"^urls\[1\] must be a str or os.PathLike .* int"):
        streamrec.open_dataset(["a.tfrecord", 7])  # type: ignore[list-item]
    with pytest.raises(ArgumentError, match=r"^template must be a str or os.PathLike"):
        streamrec.open_writer(None)  # type: ignore[arg-type]


# ------------------------------------------------------------------ arguments checked up front

BAD_READ_ARGUMENTS: list[tuple[dict[str, Any], str]] = [
    ({"shuffle_buffer": 1.5}, "shuffle_buffer must be an integer, not float (1.5)"),
    ({"shuffle_buffer": -1}, "shuffle_buffer must be an integer >= 0, not -1"),
    ({"shuffle_buffer": True}, "shuffle_buffer must be an integer, not a bool (True)"),
    ({"cycle_length": "2"}, "cycle_length must be an integer, not str ('2')"),
    ({"cycle_length": 0}, "cycle_length must be a positive integer, not 0"),
    ({"block_length": 2.0}, "block_length must be an integer, not float (2.0)"),
    ({"prefetch_bytes": 0}, "prefetch_bytes must be a positive integer, not 0"),
    ({"prefetch_bytes": 1e6}, "prefetch_bytes must be an integer, not float (1000000.0)"),
    ({"block_bytes": "4 MiB"}, "block_bytes must be an integer, not str ('4 MiB')"),
    ({"max_concurrency": False}, "max_concurrency must be an integer, not a bool (False)"),
    ({"seed": 0.5}, "seed must be an integer, not float (0.5)"),
    ({"num_hosts": 0}, "num_hosts must be a positive integer, not 0"),
    ({"host_index": -1}, "host_index must be an integer >= 0, not -1"),
    ({"num_hosts": 2, "host_index": 2}, "host_index must be in [0, 2), not 2"),
    ({"window_records": 0}, "window_records must be a positive integer, not 0"),
    ({"cache_dir": "c", "cache_bytes": 1.5}, "cache_bytes must be an integer, not float"),
    ({"verify_crc": "no"}, "verify_crc must be True or False, not 'no'"),
    ({"deterministic": 0}, "deterministic must be True or False, not 0"),
    ({"shuffle_shards": None}, "shuffle_shards must be True or False, not None"),
    ({"allow_absolute_urls": "yes"}, "allow_absolute_urls must be True or False, not 'yes'"),
    ({"on_corrupt": "ignore"}, "on_corrupt must be one of 'raise', 'skip', not 'ignore'"),
    ({"shuffle": "Global"}, "shuffle must be one of None, 'global', 'block', not 'Global'"),
    ({"shuffle": True}, "shuffle must be one of None, 'global', 'block', not True"),
    ({"even": "yes"}, "even must be one of None, False, True, 'drop', 'pad', not 'yes'"),
    ({"even": 1}, "even must be one of None, False, True, 'drop', 'pad', not 1"),
    ({"compression": "brotli"}, "compression: unknown compression 'brotli'"),
    ({"compression": 1}, "compression must be 'auto', None, 'gzip' or 'zlib', not 1"),
    ({"retry": 3}, "retry must be a streamrec RetryPolicy or None, not int"),
    ({"storage_options": "anon"}, "storage_options must be a mapping (dict) or None, not str"),
    ({"cache_dir": 3, "cache_bytes": 10}, "cache_dir must be a str or os.PathLike path"),
    ({"max_read_amplification": 0.5}, "max_read_amplification must be a number >= 1 or None"),
    ({"max_read_amplification": "2"}, "max_read_amplification must be a number >= 1 or None"),
    ({"max_read_amplification": True}, "max_read_amplification must be a number >= 1 or None"),
    ({"max_read_amplification": float("inf")}, "max_read_amplification must be a number >= 1"),
]


@pytest.mark.parametrize(("options", "message"), BAD_READ_ARGUMENTS)
def test_open_dataset_names_a_bad_argument(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        streamrec.open_dataset("data/x.tfrecord", **options)
    assert str(caught.value).startswith(message)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)


def test_numpy_integers_are_integers(tmp_path: Path) -> None:
    shard = write_records(tmp_path / "a.tfrecord", [b"%d" % i for i in range(10)])
    ds = streamrec.open_dataset(shard, shuffle_buffer=np.int64(4), seed=np.int32(1))
    assert type(ds.options.shuffle_buffer) is int and ds.options.shuffle_buffer == 4
    assert sorted(ds) == sorted(b"%d" % i for i in range(10))


BAD_WRITE_ARGUMENTS: list[tuple[dict[str, Any], str]] = [
    ({"max_records": 1.5}, "max_records must be an integer, not float (1.5)"),
    ({"max_records": True}, "max_records must be an integer, not a bool (True)"),
    ({"max_bytes": 0}, "max_bytes must be a positive integer, not 0"),
    ({"num_shards": "4"}, "num_shards must be an integer, not str ('4')"),
    ({"part_bytes": 0}, "part_bytes must be a positive integer, not 0"),
    ({"max_concurrency": 2.5}, "max_concurrency must be an integer, not float (2.5)"),
    ({"flush_bytes": -1}, "flush_bytes must be a positive integer, not -1"),
    ({"compression_level": 10}, "compression_level must be in [-1, 9], not 10"),
    ({"compression_level": "9"}, "compression_level must be an integer, not str ('9')"),
    ({"first_index": -1}, "first_index must be an integer >= 0, not -1"),
    ({"index": 1}, "index must be True or False, not 1"),
    ({"order": "sorted"}, "order must be one of 'round_robin', 'contiguous', not 'sorted'"),
    (
        {"num_shards": 2, "order": "contiguous", "total_records": 2.0},
        "total_records must be an integer, not float (2.0)",
    ),
    ({"compression": 6}, "compression must be None, 'gzip' or 'zlib', not 6"),
    ({"manifest": 1}, "manifest must be a str or os.PathLike path or url, not int"),
    ({"retry": "3"}, "retry must be a streamrec RetryPolicy or None, not str"),
    ({"storage_options": []}, "storage_options must be a mapping (dict) or None, not list"),
]


@pytest.mark.parametrize(("options", "message"), BAD_WRITE_ARGUMENTS)
def test_open_writer_names_a_bad_argument(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    template = str(tmp_path / "part-{index:02d}.tfrecord")
    for open_writer in (streamrec.open_writer, streamrec.sync.open_writer):
        with pytest.raises(ArgumentError) as caught:
            open_writer(template, **options)
        assert str(caught.value).startswith(message)
    assert os.listdir(tmp_path) == []  # refused before anything was written


# ------------------------------------------------------------------ the CLI's own spellings

PLAIN_AS_GZ = "gzip: the file is not gzip data (looks like an uncompressed TFRecord file: "


def test_the_compression_hint_uses_the_cli_spelling(tmp_path: Path) -> None:
    shard = write_records(tmp_path / "plain.tfrecord.gz", [b"x" * 10])
    # the library's own spelling, for library users
    with pytest.raises(streamrec.errors.CompressionError) as caught:
        list(streamrec.open_dataset(shard))
    assert f"{PLAIN_AS_GZ}read it with compression=None)" in str(caught.value)
    # the command line's, for its users: they cannot pass compression=None
    run = cli("count", str(shard))
    assert run.rc == 1
    assert run.err == (
        f"streamrec: error: record 0 in {shard} at byte offset 0: "
        f"{PLAIN_AS_GZ}read it with --compression none)\n"
    )
    verify = cli("verify", "--json", str(shard))
    assert f"{PLAIN_AS_GZ}read it with --compression none)" in verify.out
    assert "compression=None" not in verify.out + verify.err
    assert cli("count", "--compression", "none", str(shard)).rc == 0  # the hint works
    gz = tmp_path / "data.tfrecord"
    gz.write_bytes(write_records(tmp_path / "real.gz", [b"y"], compression="gzip").read_bytes())
    run = cli("head", "--compression", "none", str(gz))
    assert "(looks like gzip: try --compression auto or gzip)" in run.err
    # reshard reads its inputs by suffix (its --compression is the output's)
    run = cli("reshard", str(shard), str(tmp_path / "out" / "p-{index}.tfrecord"))
    assert run.rc == 1
    assert run.err.splitlines()[-1] == (
        f"streamrec reshard: error: record 0 in {shard} at byte offset 0: {PLAIN_AS_GZ}"
        "rename it without its .gz/.zz suffix: reshard picks an input's compression by its "
        "suffix, else by its first bytes)"
    )


@pytest.mark.slow  # seconds: in the slow step
def test_reshard_takes_timeout_like_every_command(
    tmp_path: Path, http_dir: HttpDir, fault_proxy: Callable[..., FaultProxy]
) -> None:
    assert "--timeout SECONDS" in cli("reshard", "--help").out
    url = http_dir.write("data.tfrecord", b"")
    proxy = fault_proxy(url.split("/dir-")[0])
    proxy.stall(60, method="GET")  # nothing ever comes back (stop() ends the stall)
    proxied = proxy.url + "/" + url.split("/", 3)[3]
    out = str(tmp_path / "out" / "part-{index:02d}.tfrecord")
    run = cli("reshard", "--timeout", "0.3", "--no-progress", proxied, out)
    assert run.rc == 1, run.err
    last = run.err.splitlines()[-1]
    assert last.startswith(f"streamrec reshard: error: listing {proxied}: gave up after 6 attempt")
    assert "RetryPolicy timeout_s=0.3 per attempt" in last


# ------------------------------------------------------------------ ordinals, stats


@pytest.mark.parametrize(
    ("consumers", "word"), [(2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (21, "21st")]
)
def test_the_split_by_record_warning_says_ordinals(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, consumers: int, word: str
) -> None:
    shard = write_records(tmp_path / "one.tfrecord", [b"%d" % i for i in range(30)])
    with caplog.at_level("WARNING", logger="streamrec"):
        got = list(streamrec.open_dataset(shard, num_hosts=consumers, host_index=1))
    assert got == [b"%d" % i for i in range(1, 30, consumers)]
    assert (
        f"1 shard(s) for {consumers} consumers (hosts x workers): splitting by record instead "
        f"(each reads every shard and keeps every {word} record); write more shards to avoid "
        "the extra reading"
    ) in caplog.messages


@pytest.mark.parametrize(
    "options",
    [{}, {"cycle_length": 2}, {"shuffle": "global"}, {"shuffle": "block"}, {"even": True}],
    ids=["sequential", "interleave", "global", "block", "even"],
)
def test_a_resumed_read_counts_the_shards_it_opens(tmp_path: Path, options: dict[str, Any]) -> None:
    template = tmp_path / "part-{index:02d}.tfrecord"
    with streamrec.sync.open_writer(template, max_records=100, index=True) as w:
        w.write_many(b"%d" % i for i in range(300))
    first = streamrec.open_dataset(tmp_path, **options)
    it = iter(first)
    taken = [next(it) for _ in range(150)]
    state = first.state_dict()
    it.close()
    assert first.stats.shards_opened >= 2
    resumed = streamrec.open_dataset(tmp_path, **options)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert sorted(taken + rest) == sorted(b"%d" % i for i in range(300))
    # was 0 for reads by index: the shards a resumed read opens are counted like any
    assert resumed.stats.as_dict()["shards_opened"] >= 2
    assert resumed.stats.shards_opened <= 3


# ------------------------------------------------------------------ cleanup


def test_cleanup_says_how_many_it_left_alone_and_why(tmp_path: Path) -> None:
    young = [tmp_path / ".a.tfrecord.0123456789ab.tmp", tmp_path / ".b.tfrecord.0123456789ac.tmp"]
    old = tmp_path / ".c.tfrecord.0123456789ad.tmp"
    for path in [*young, old]:
        path.write_bytes(b"x")
    three_hours_ago = os.path.getmtime(old) - 3 * 3600
    os.utime(old, (three_hours_ago, three_hours_ago))
    run = cli("cleanup", f"{tmp_path}/")
    assert run.rc == 0, run.err
    lines = run.out.splitlines()
    assert re.fullmatch(
        rf"removed: temporary file of {tmp_path}/c\.tfrecord \(10,8\d\d s old\)", lines[0]
    )
    # was: "1 leftover(s) found, 1 removed", not a word about the two younger ones
    assert re.fullmatch(
        r"1 leftover\(s\) found, 1 removed; 2 left alone, begun less than --older-than 1h ago "
        r"\(the oldest \d+ s ago\): their writers may still be at work \(--older-than 0 "
        r"removes them too\)",
        lines[1],
    ), lines[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in young)
    document = json.loads(cli("cleanup", str(tmp_path), "--older-than", "30m", "--json").out)
    assert document == {
        "leftovers": [],
        "removed": 0,
        "dry_run": False,
        "left_alone": 2,
        "older_than_s": 1800.0,
    }
    assert cli("cleanup", str(tmp_path), "--older-than", "0").out.splitlines()[-1] == (
        "2 leftover(s) found, 2 removed"
    )


# ------------------------------------------------------------------ the async writer misused

ASYNC_WRITER = (
    "use `async with streamrec.open_writer(...) as w: await w.write(payload)` in async code, "
    "or `with streamrec.sync.open_writer(...) as w: w.write(payload)` in plain code"
)


def test_the_async_writer_in_plain_code_says_what_to_use(tmp_path: Path) -> None:
    url = tmp_path / "out.tfrecord"
    writer = streamrec.open_writer(url)
    with pytest.raises(TypeError) as caught:
        writer.write(b"x")  # was: a coroutine never awaited, a warning, no file
    assert str(caught.value) == (
        "ShardWriter.write() called outside an event loop: streamrec.open_writer is async and "
        f"its write() writes nothing unless awaited; {ASYNC_WRITER}"
    )
    with pytest.raises(TypeError, match=r"^ShardWriter\.write_many\(\) called outside"):
        writer.write_many([b"x"])
    with pytest.raises(TypeError, match=r"^ShardWriter\.close\(\) called outside"):
        writer.close()
    with pytest.raises(TypeError) as caught, streamrec.open_writer(url):  # type: ignore[attr-defined]
        pass
    assert str(caught.value) == f"streamrec.open_writer is async: {ASYNC_WRITER}"
    assert not url.exists()


def test_a_write_never_awaited_fails_the_close(tmp_path: Path) -> None:
    url = tmp_path / "part-{index}.tfrecord"

    async def forgets_an_await() -> None:
        async with streamrec.open_writer(url, max_records=1) as w:
            await w.write(b"kept?")
            w.write(b"lost")  # type: ignore[unused-coroutine]  # (no await)
            await w.write(b"after")

    with pytest.warns(RuntimeWarning, match="never awaited"), pytest.raises(TypeError) as caught:
        asyncio.run(forgets_an_await())
    assert str(caught.value) == (
        "1 write()/write_many() call(s) of this writer were never awaited: their records were "
        "not written, so the writer is aborted (no manifest; shards not yet committed are "
        f"dropped); await every call: {ASYNC_WRITER}"
    )
    assert not (tmp_path / "_manifest.json").exists()  # never an incomplete set that looks whole

    async def awaits_them_all() -> None:
        async with streamrec.open_writer(tmp_path / "ok.tfrecord") as w:
            await asyncio.gather(w.write(b"a"), w.write_many([b"b", b"c"]))

    asyncio.run(awaits_them_all())
    assert list(streamrec.open_dataset(tmp_path / "ok.tfrecord")) == [b"a", b"b", b"c"]


# ------------------------------------------------------------------ inspect


def test_inspect_says_what_its_sample_covered(tmp_path: Path) -> None:
    # "extra" is in the first 2,536 records only: a sample of 1,000 sees it everywhere
    with streamrec.sync.open_writer(tmp_path / "part-{index}.tfrecord", max_records=1000) as w:
        for i in range(3000):
            w.write(encode({"id": i, **({"extra": 1} if i < 2536 else {})}))
    run = cli("inspect", str(tmp_path))
    assert run.rc == 0, run.err
    lines = run.out.splitlines()
    assert (
        "  extra  int64  1000/1000  1              -            FixedLenFeature(np.int64)" in lines
    )
    at = lines.index("suggested spec (from 1,000 sampled records):")
    assert lines[at - 1] == (
        "note: the sample is the first 1,000 records only (from 1 of 3 shards), not every "
        "record: a feature present in all of them may be missing in a later one, where its "
        "FixedLenFeature fails to parse; sample more with --sample N, or every record with --all"
    )
    report = cli("inspect", "--json", "-n", "2000", str(tmp_path)).json()
    assert (report["records"], report["complete"]) == (2000, False)
    assert (report["shards_sampled"], report["shards_listed"]) == (2, 3)

    every = cli("inspect", "--all", str(tmp_path))
    assert every.rc == 0, every.err
    lines = every.out.splitlines()
    at = lines.index("suggested spec (from 3,000 sampled records):")
    assert lines[at - 1] == "note: the sample is every record (3,000 records in 3 shards)"
    assert "    'extra': VarLenFeature(np.int64)," in lines
    report = cli("inspect", "--json", "--all", str(tmp_path)).json()
    assert (report["records"], report["complete"], report["shards_sampled"]) == (3000, True, 3)
    assert cli("inspect", "-n", "5", "--all", str(tmp_path)).rc == 2  # one or the other


# ------------------------------------------------------------------ where a bad Example is

SPEC = {"id": FixedLenFeature(np.int64), "extra": FixedLenFeature(np.int64)}
MISSING = "feature 'extra': missing, and its FixedLenFeature spec has no default"


def two_shards_one_bad_record(
    directory: Path, compression: str | None = None
) -> tuple[list[bytes], int]:
    """600 Examples in two indexed shards of 300; the 450th (record 149 of part-1) lacks
    "extra"; returns the payloads and that record's byte offset in part-1 (in its
    uncompressed stream, as every error says)."""
    payloads = [encode({"id": i, **({"extra": 1} if i != 449 else {})}) for i in range(600)]
    template = directory / ("part-{index}.tfrecord" + (".gz" if compression else ""))
    with streamrec.sync.open_writer(
        template, max_records=300, index=True, compression=compression
    ) as w:
        w.write_many(payloads)
    return payloads, sum(len(p) + 16 for p in payloads[300:449])


@pytest.mark.parametrize(
    ("options", "batch", "compression"),
    [
        ({}, None, None),
        ({}, 256, None),
        ({}, 100, "gzip"),
        ({"shuffle_buffer": 100, "seed": 3}, None, None),
        ({"shuffle_buffer": 50}, 64, None),
        ({"cycle_length": 2, "block_length": 3}, 100, None),
        ({"cycle_length": 2, "deterministic": False}, None, None),
        ({"shuffle": "global", "seed": 1}, None, None),
        ({"shuffle": "global"}, 128, "gzip"),
        ({"shuffle": "block", "window_records": 16}, 64, None),
        ({"even": True, "num_hosts": 2, "host_index": 1}, None, None),
    ],
    ids=[
        "parse",
        "batch",
        "gzip-batch",
        "shuffle",
        "shuffle-batch",
        "interleave",
        "first-ready",
        "global",
        "gzip-global-batch",
        "block-batch",
        "even",
    ],
)
def test_a_parse_error_names_the_shard_record_and_offset(
    tmp_path: Path, options: dict[str, Any], batch: int | None, compression: str | None
) -> None:
    _, offset = two_shards_one_bad_record(tmp_path, compression)
    shard = f"{tmp_path}/part-1.tfrecord" + (".gz" if compression else "")
    message = f"record 149 in {shard} at byte offset {offset}: {MISSING}"
    ds = streamrec.open_dataset(tmp_path, **options).parse(SPEC)
    chain = ds if batch is None else ds.batch(batch)
    with pytest.raises(streamrec.errors.FeatureError) as caught:
        for _ in chain:
            pass
    # was: "feature 'extra': record 193 of the batch: missing, ..." (or no place at all)
    assert str(caught.value) == message
    error = caught.value
    assert (error.url, error.record_index, error.offset) == (shard, 149, offset)
    assert str(pickle.loads(pickle.dumps(error))) == message

    async def read_async() -> None:
        async for _ in chain:
            pass

    with pytest.raises(streamrec.errors.FeatureError) as caught:
        asyncio.run(read_async())
    assert str(caught.value) == message


def test_decode_batch_on_a_list_says_its_place_in_the_batch(tmp_path: Path) -> None:
    payloads, _ = two_shards_one_bad_record(tmp_path)
    with pytest.raises(streamrec.errors.FeatureError) as caught:
        decode_batch(payloads[400:], SPEC)
    assert str(caught.value) == (
        "feature 'extra': record 49 of the batch: missing, and its FixedLenFeature spec has "
        "no default"
    )
    assert caught.value.batch_index == 49 and caught.value.url is None


def test_a_parse_error_of_records_split_across_hosts_names_the_shard(tmp_path: Path) -> None:
    two_shards_one_bad_record(tmp_path)
    # 2 shards, 3 hosts: each reads every 3rd record of every shard (index 449 = 2 mod 3)
    ds = streamrec.open_dataset(tmp_path, num_hosts=3, host_index=2).parse(SPEC)
    with pytest.raises(streamrec.errors.FeatureError) as caught:
        list(ds)
    assert str(caught.value) == f"in {tmp_path}/part-1.tfrecord: {MISSING}"


@pytest.mark.parametrize("batch", [None, 32])
def test_a_parse_error_in_a_mix_names_the_shard_record_and_offset(
    tmp_path: Path, batch: int | None
) -> None:
    _, offset = two_shards_one_bad_record(tmp_path / "mixed")
    good = write_records(
        tmp_path / "good.tfrecord", [encode({"id": i, "extra": 2}) for i in range(500)]
    )
    mixed = streamrec.mix(
        [streamrec.open_dataset(good), streamrec.open_dataset(tmp_path / "mixed")],
        weights=[0.5, 0.5],
        seed=0,
    ).parse(SPEC)
    with pytest.raises(streamrec.errors.FeatureError) as caught:
        for _ in mixed if batch is None else mixed.batch(batch):
            pass
    assert str(caught.value) == (
        f"record 149 in {tmp_path}/mixed/part-1.tfrecord at byte offset {offset}: {MISSING}"
    )


def test_cleanup_takes_timeout_like_every_command(
    s3_server: MotoS3Server, s3_bucket: str, fault_proxy: Callable[..., FaultProxy]
) -> None:
    proxy = fault_proxy(s3_server.endpoint_url)
    proxy.stall(60, method="GET")  # the listing of open uploads never comes back
    options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.url}}
    prefix = f"s3://{s3_bucket}/out/"
    run = cli("cleanup", prefix, "--timeout", "0.3", "--storage-options", json.dumps(options))
    assert run.rc == 1, run.err
    last = run.err.splitlines()[-1]
    assert last.startswith(
        f"streamrec: error: listing the unfinished writes under {prefix}: gave up after 6 "
    ), last
    assert "RetryPolicy timeout_s=0.3 per attempt" in last


def test_a_manifest_naming_outside_shards_gets_a_hint_the_cli_can_follow(tmp_path: Path) -> None:
    with streamrec.sync.open_writer(tmp_path / "set" / "part-{index}.tfrecord", max_records=2) as w:
        w.write_many([b"a", b"b", b"c"])
    outside = write_records(tmp_path / "elsewhere.tfrecord", [b"c"])
    manifest = tmp_path / "set" / "_manifest.json"
    document = json.loads(manifest.read_text())
    document["shards"][1]["name"] = str(outside)
    manifest.write_text(json.dumps(document))
    problem = (
        f"in {manifest}: not a valid streamrec manifest: shard 1: '{outside}' is an absolute "
        "url outside the manifest's directory; names must be relative to it ("
    )
    with pytest.raises(streamrec.errors.FormatError) as caught:
        list(streamrec.open_dataset(manifest))
    assert str(caught.value) == f"{problem}pass allow_absolute_urls=True to trust this manifest)"
    run = cli("count", str(manifest))
    assert run.rc == 1
    assert run.err == (
        f"streamrec: error: {problem}the command line never follows such names: give the "
        "shards' urls instead)\n"
    )
