"""streamrec.reshard.job against real stores: local files, S3 (moto), GCS (fake-gcs-server) and
Azure (Azurite).

What is checked: the output's multiset of payloads equals the input's; the manifest lists
exactly the shards present (no stray, duplicate or missing shard, no scratch left); rotation
limits and fixed shard counts hold; the same arguments give byte-identical output; a run killed
with SIGKILL half-way and run again ends with exactly the output of an uninterrupted run,
without redoing the tasks that were finished.
"""

from __future__ import annotations

import asyncio
import collections
import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import fsspec
import pytest

import streamrec
from streamrec.cli.reshard import main as cli_main
from streamrec.cli.reshard import parse_bytes
from streamrec.format.framing import RecordEncoder
from streamrec.format.index.dataset import DatasetIndex
from streamrec.manifest.core import Manifest, load_manifest
from streamrec.reshard.job import ReshardProgress, ReshardSummary, reshard
from streamrec.reshard.plan import Naming, make_plan, split_counts, split_groups
from streamrec.storage.base import ObjectInfo
from support.azurite import AzuriteServer
from support.indexes import check_sidecar
from support.servers import FakeGcsServer, MotoS3Server

REPO = Path(__file__).resolve().parents[2]
# The writer's exact compressed rotation can overshoot max_bytes by a few bytes: _add_exact
# sync-flushes the shard before learning that the record does not fit, and those flush bytes
# stay. Set to 0 once write.planner.Planner._add_exact syncs a copy (the fix is in the reshard
# report).
COMPRESSED_OVERSHOOT = 0


# ----------------------------------------------------------------------------------------------
# data


def make_records(n: int = 240, salt: str = "r") -> list[bytes]:
    """Distinct payloads of varied lengths (some repeated bytes, so gzip has work)."""
    return [
        f"{salt}{i:05d}:".encode() + bytes([65 + i % 26]) * (7 + (i * 37) % 150) for i in range(n)
    ]


def framed_shards(records: list[bytes], sizes: list[int]) -> list[bytes]:
    """TFRecord files holding ``records`` cut into consecutive pieces of ``sizes``."""
    assert sum(sizes) == len(records)
    encoder = RecordEncoder()
    out, start = [], 0
    for size in sizes:
        out.append(encoder.encode_many(records[start : start + size]))
        start += size
    return out


SIZES = [50, 10, 70, 5, 60, 45]  # six input shards of uneven size


def input_files(records: list[bytes]) -> dict[str, bytes]:
    """name -> stored bytes: six shards, the 2nd and 5th gzip-compressed."""
    files = {}
    for k, data in enumerate(framed_shards(records, SIZES)):
        if k in (1, 4):
            files[f"in-{k:02d}.tfrecord.gz"] = gzip.compress(data, mtime=0)
        else:
            files[f"in-{k:02d}.tfrecord"] = data
    return files


def write_local(root: Path, files: dict[str, bytes]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return str(root / "in-*")


def payloads(urls: list[str], options: dict[str, Any] | None = None) -> collections.Counter[bytes]:
    return collections.Counter(streamrec.open_dataset(urls, storage_options=options))


def manifest_of(summary: ReshardSummary, options: dict[str, Any] | None) -> Manifest:
    return asyncio.run(load_manifest(summary.manifest_url, options))


def relative(manifest: Manifest, base: str) -> list[tuple[str, int, int, int, int]]:
    """(name relative to ``base``, index, records, bytes, crc32c) of every shard."""
    rows = []
    for e in manifest.shards:
        assert e.url.startswith(base), (e.url, base)
        rows.append((e.url[len(base) :], e.index, e.records, e.bytes, e.crc32c))
    return rows


def check_output(
    summary: ReshardSummary,
    want: collections.Counter[bytes],
    options: dict[str, Any] | None,
    listed: list[str],
    indexed: bool = False,
) -> Manifest:
    """The output holds exactly ``want``; ``listed`` (every object under the output prefix, as
    urls) is exactly the manifest's shards (``indexed``: and their index sidecars, each a
    valid index of its shard) plus the manifest: nothing stray, no scratch."""
    manifest = manifest_of(summary, options)
    assert [e.url for e in manifest.shards] == summary.shards
    assert [e.index for e in manifest.shards] == list(range(len(manifest.shards)))
    sidecars = [url + ".idx" for url in summary.shards] if indexed else []
    dataset_index = summary.manifest_url.rpartition("/")[0] + "/_dataset_index.bin"
    extra = [dataset_index] if indexed else []  # every shard's index in one object
    assert sorted(listed) == sorted([*summary.shards, *sidecars, *extra, summary.manifest_url])
    assert manifest.records == summary.records == sum(want.values())
    assert manifest.bytes == summary.bytes_out
    assert payloads(summary.shards, options) == want
    fs = fsspec.filesystem("file") if "://" not in summary.shards[0] else None
    for entry in manifest.shards:
        assert entry.index_url == (entry.url + ".idx" if indexed else None)
        if entry.index_url is None:
            continue
        if fs is None:
            fs, _ = fsspec.core.url_to_fs(entry.url, **(options or {}))
        stored, sidecar = fs.cat_file(entry.url), fs.cat_file(entry.index_url)
        assert entry.index_bytes == len(sidecar)
        records = list(streamrec.open_dataset(entry.url, storage_options=options))
        check_sidecar(stored, sidecar, manifest.compression, records)
    if indexed:  # the dataset index holds the sidecars' entries, shard by shard
        assert fs is not None
        index = DatasetIndex(fs.cat_file(dataset_index), source=dataset_index)
        assert [s.records for s in index.shards] == [e.records for e in manifest.shards]
        for k, entry in enumerate(manifest.shards):
            assert entry.index_url is not None
            assert index.shard_index(k).to_bytes() == fs.cat_file(entry.index_url)
    return manifest


# ----------------------------------------------------------------------------------------------
# planning (no I/O)


def test_split_groups_is_exact_balanced_and_keeps_order() -> None:
    assert split_groups([1, 1, 1, 1], 2) == [[0, 1], [2, 3]]
    assert split_groups([10, 1, 1, 1, 1, 10], 3) == [[0], [1, 2, 3, 4], [5]]
    assert split_groups([0, 0, 0], 3) == [[0], [1], [2]]
    for sizes, parts in [([5] * 17, 4), ([100, 1, 1, 1, 1, 1, 1], 5), ([3, 9, 27, 81], 4)]:
        groups = split_groups(sizes, parts)
        assert len(groups) == parts and all(groups)
        assert [i for g in groups for i in g] == list(range(len(sizes)))
    with pytest.raises(ValueError):
        split_groups([1, 2], 3)


def test_split_counts_is_proportional_and_exact() -> None:
    assert split_counts([1, 1], 4) == [2, 2]
    assert split_counts([3, 1], 5) == [4, 1]
    assert split_counts([0, 0, 0], 4) == [2, 1, 1]
    counts = split_counts([1000, 1, 1], 10)
    assert sum(counts) == 10 and min(counts) == 1 and counts[0] == 8


def test_naming_of_rotation_and_fixed_outputs() -> None:
    rotate = Naming("s3://b/o/part-{index:05d}.tfrecord", "rotate", None)
    assert rotate.task_template(3).format(index=1) == "s3://b/o/part-00003-00001.tfrecord"
    assert rotate.manifest_url == "s3://b/o/_manifest.json"
    own = Naming("o/{{x}}-{task:03d}-{index:04d}.rec", "rotate", None)
    assert own.task_template(2).format(index=7) == "o/{x}-002-0007.rec"
    fixed = Naming("gs://b/t-{index:05d}-of-{num_shards:05d}", "fixed", 16)
    assert fixed.fixed_url(3) == "gs://b/t-00003-of-00016"
    assert Naming("out/all.tfrecord", "fixed", 1).fixed_url(0) == "out/all.tfrecord"
    for template, mode, n, message in [
        ("o/part.tfrecord", "rotate", None, "no {index}"),
        ("o/part.tfrecord", "fixed", 4, "no {index}"),
        ("o/{num_shards}-{index}", "rotate", None, "{num_shards}"),
        ("o/{task}-{index}", "fixed", 2, "{task}"),
        ("o/{index}/x", "fixed", 2, "directory"),
        ("o/{shard}", "fixed", 2, "{shard}"),
    ]:
        with pytest.raises(ValueError, match=message.replace("{", r"\{").replace("}", r"\}")):
            Naming(template, mode, n)  # type: ignore[arg-type]


def test_plan_is_deterministic_and_fingerprint_follows_arguments() -> None:
    inputs = [ObjectInfo(f"s3://b/in-{k}", 100 + k, f"etag{k}") for k in range(9)]

    def plan(**kwargs: Any) -> Any:
        settings: dict[str, Any] = {
            "max_records": None,
            "max_bytes": 250,
            "num_shards": None,
            "compression": None,
            "shuffle": False,
            "seed": 0,
            "task_bytes": 300,
        }
        settings.update(kwargs)
        return make_plan(inputs, "s3://b/out/p-{index:03d}", **settings)

    base = plan()
    again = make_plan(
        list(reversed(inputs)),
        "s3://b/out/p-{index:03d}",
        max_records=None,
        max_bytes=250,
        num_shards=None,
        compression=None,
        shuffle=False,
        seed=0,
        task_bytes=300,
    )
    assert again == base  # input order does not matter: sorted
    assert [len(t.inputs) for t in base.tasks] == [3, 3, 3]
    assert base.tasks[1].scratch_url == f"s3://b/out/_reshard/{base.fingerprint}/task-00001.json"
    assert plan(compression="gzip").fingerprint != base.fingerprint
    assert plan(max_bytes=251).fingerprint != base.fingerprint
    assert plan(task_bytes=301).fingerprint != base.fingerprint
    shuffled = plan(shuffle=True, seed=5)
    assert shuffled == plan(shuffle=True, seed=5)
    assert shuffled.fingerprint != plan(shuffle=True, seed=6).fingerprint
    assert [o.url for t in shuffled.tasks for o in t.inputs] != [o.url for o in base.inputs]
    changed = [*inputs[:-1], ObjectInfo(inputs[-1].url, inputs[-1].size, "other-etag")]
    assert make_plan(changed, "s3://b/out/p-{index:03d}", max_records=None, max_bytes=250,
                     num_shards=None, compression=None, shuffle=False, seed=0,
                     task_bytes=300).fingerprint != base.fingerprint  # fmt: skip
    fixed = plan(max_bytes=None, num_shards=20, task_bytes=None)
    assert [u for t in fixed.tasks for u in t.outputs] == [
        f"s3://b/out/p-{k:03d}" for k in range(20)
    ]
    with pytest.raises(ValueError, match="num_shards"):
        plan(num_shards=3)


def test_parse_bytes_units() -> None:
    assert parse_bytes("1048576") == 1 << 20
    assert parse_bytes("256MiB") == 256 << 20
    assert parse_bytes("1GB") == 10**9
    assert parse_bytes("1.5 kib") == 1536
    assert parse_bytes("64K") == 64_000
    for bad in ("", "12x", "MiB", "-5", "0", "1.5.5"):
        with pytest.raises(Exception, match="byte"):
            parse_bytes(bad)


# ----------------------------------------------------------------------------------------------
# local files


def test_local_modes_shuffle_and_determinism(tmp_path: Path) -> None:
    records = make_records()
    want = collections.Counter(records)
    sources = write_local(tmp_path / "in", input_files(records))
    events: list[ReshardProgress] = []
    cases: list[dict[str, Any]] = [
        {"max_records": 40, "task_bytes": 3000},
        {"max_bytes": 1000, "compression": "gzip", "task_bytes": 8000},
        {"num_shards": 4, "compression": "zlib"},
        {"num_shards": 13},
        {"max_records": 33, "shuffle": True, "seed": 3, "task_bytes": 6000},
        {},
    ]
    for k, case in enumerate(cases):
        out = tmp_path / f"out{k}"
        summary = reshard(
            sources, f"{out}/part-{{index:04d}}.tfrecord", progress=events.append, **case
        )
        check_output(summary, want, None, [str(p) for p in sorted(out.iterdir())])
        manifest = manifest_of(summary, None)
        if "max_records" in case:
            assert max(e.records for e in manifest.shards) <= case["max_records"]
        if "max_bytes" in case:
            assert max(e.bytes for e in manifest.shards) <= case["max_bytes"] + COMPRESSED_OVERSHOOT
            assert len(manifest.shards) > summary.tasks  # the writer rotated inside tasks
        if "num_shards" in case:
            assert summary.shards == [
                f"{out}/part-{i:04d}.tfrecord" for i in range(case["num_shards"])
            ]
        if not case:
            assert summary.shards == [f"{out}/part-0000.tfrecord"]
        if case.get("shuffle"):
            order = list(streamrec.open_dataset(summary.shards))
            assert order != records
            again = reshard(
                sources, f"{tmp_path}/again/part-{{index:04d}}.tfrecord", progress=False, **case
            )
            assert list(streamrec.open_dataset(again.shards)) == order
            assert [e.crc32c for e in manifest_of(again, None).shards] == [
                e.crc32c for e in manifest.shards
            ]
        assert summary.bytes_in == sum(
            (tmp_path / "in" / n).stat().st_size for n in input_files(records)
        )
        assert summary.bytes_read == summary.bytes_in and summary.tasks_skipped == 0
    assert events and events[-1].bytes_read == events[-1].bytes_total
    assert events[-1].tasks_done == events[-1].tasks_total


def test_a_finished_task_is_not_redone_and_damage_is_reported(tmp_path: Path) -> None:
    records = make_records(120)
    shards = framed_shards(records, [30, 30, 30, 30])
    for k, data in enumerate(shards):
        (tmp_path / f"in-{k}.tfrecord").write_bytes(data)
    bad = bytearray(shards[3])
    bad[-3] ^= 0xFF  # the last record's payload CRC no longer matches
    (tmp_path / "in-3.tfrecord").write_bytes(bytes(bad))
    template = f"{tmp_path}/out/p-{{index:02d}}.tfrecord"
    with pytest.raises(streamrec.errors.CorruptRecordError, match=r"in-3\.tfrecord"):
        reshard(str(tmp_path / "in-*.tfrecord"), template, num_shards=4, progress=False)
    assert not (tmp_path / "out" / "_manifest.json").exists()
    done = sorted(p.name for p in (tmp_path / "out").rglob("task-*.json"))
    assert done == ["task-00000.json", "task-00001.json", "task-00002.json"]
    (tmp_path / "in-3.tfrecord").write_bytes(shards[3])  # repaired, same size
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "out").glob("p-0[012].tfrecord")}
    summary = reshard(str(tmp_path / "in-*.tfrecord"), template, num_shards=4, progress=False)
    assert summary.tasks_skipped == 3 and summary.bytes_read == len(shards[3])
    assert {p: p.stat().st_mtime_ns for p in before} == before  # not rewritten
    listed = [str(p) for p in sorted((tmp_path / "out").iterdir())]
    check_output(summary, collections.Counter(records), None, listed)


def test_a_rerun_into_the_same_directory_removes_the_old_manifest_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = make_records(120)
    shards = framed_shards(records, [30, 30, 30, 30])
    for k, data in enumerate(shards):
        (tmp_path / f"in-{k}.tfrecord").write_bytes(data)
    template = f"{tmp_path}/out/p-{{index:02d}}.tfrecord"
    reshard(str(tmp_path / "in-*.tfrecord"), template, num_shards=4, progress=False)
    assert (tmp_path / "out" / "_manifest.json").exists()
    # other inputs, same output names; the run fails after rewriting some of the shards
    others = framed_shards(make_records(120, salt="new"), [30, 30, 30, 30])
    bad = bytearray(others[3])
    bad[-3] ^= 0xFF
    others[3] = bytes(bad)
    for k, data in enumerate(others):
        (tmp_path / f"in-{k}.tfrecord").write_bytes(data)
    with pytest.raises(streamrec.errors.CorruptRecordError):
        reshard(str(tmp_path / "in-*.tfrecord"), template, num_shards=4, progress=False)
    assert not (tmp_path / "out" / "_manifest.json").exists()  # no stale manifest left
    assert "removed the manifest of an earlier write" in caplog.text


def test_bad_arguments_fail_before_any_write(tmp_path: Path) -> None:
    sources = write_local(tmp_path / "in", input_files(make_records()))
    out = f"{tmp_path}/out/p-{{index}}.tfrecord"
    with pytest.raises(ValueError, match="num_shards"):
        reshard(sources, out, num_shards=2, max_records=5, progress=False)
    with pytest.raises(ValueError, match="compression"):
        reshard(sources, out, compression="auto", progress=False)
    with pytest.raises(ValueError, match="would write"):
        reshard(f"{tmp_path}/in/*", f"{tmp_path}/in/in-00.tfrecord", progress=False)
    with pytest.raises(ValueError, match="would write"):  # in place: would overwrite its input
        reshard(sources, f"{tmp_path}/in/in-{{index:02d}}.tfrecord", max_records=9, progress=False)
    with pytest.raises(streamrec.errors.ObjectNotFoundError, match="nothing-here"):
        reshard(f"{tmp_path}/nothing-here/*", out, progress=False)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------
# remote stores


@pytest.mark.parametrize(
    "case",
    [
        {"max_records": 45, "task_bytes": 8000},
        {"max_bytes": 1000, "compression": "gzip", "task_bytes": 8000},
        {"num_shards": 3, "compression": "zlib"},
        {"max_records": 45, "task_bytes": 8000, "index": True},
        {"max_bytes": 1000, "compression": "gzip", "task_bytes": 8000, "index": True},
    ],
    ids=["max_records", "max_bytes-gzip", "num_shards-zlib", "max_records-index", "gzip-index"],
)
def test_local_to_s3(
    tmp_path: Path, s3_server: MotoS3Server, s3_bucket: str, case: dict[str, Any]
) -> None:
    records = make_records()
    sources = write_local(tmp_path / "in", input_files(records))
    options = s3_server.storage_options
    summary = reshard(
        sources,
        f"s3://{s3_bucket}/out/part-{{index:05d}}.tfrecord",
        dst_storage_options=options,
        progress=False,
        **case,
    )
    listed = [f"s3://{s3_bucket}/{key}" for key in s3_server.list(s3_bucket)]
    indexed = case.get("index", False)
    manifest = check_output(summary, collections.Counter(records), options, listed, indexed)
    assert manifest.compression == case.get("compression")
    if "max_bytes" in case:
        assert max(e.bytes for e in manifest.shards) <= case["max_bytes"] + COMPRESSED_OVERSHOOT
    assert s3_server.list_multipart_uploads(s3_bucket) == []


@pytest.mark.parametrize(
    "case",
    [
        {"max_records": 45, "task_bytes": 4000, "compression": "gzip"},
        {"max_bytes": 4000, "task_bytes": 7000, "shuffle": True, "seed": 1},
        {"num_shards": 8, "compression": "zlib", "shuffle": True},
        {"max_bytes": 4000, "task_bytes": 7000, "compression": "gzip", "index": True},
    ],
    ids=["max_records-gzip", "max_bytes-shuffle", "num_shards-zlib-shuffle", "gzip-index"],
)
def test_s3_to_gcs(
    s3_server: MotoS3Server,
    s3_bucket: str,
    gcs_server: FakeGcsServer,
    gcs_bucket: str,
    case: dict[str, Any],
) -> None:
    records = make_records(salt="g")
    for name, data in input_files(records).items():
        s3_server.put(s3_bucket, f"src/{name}", data)
    template = f"gs://{gcs_bucket}/dst/train-{{index:05d}}.tfrecord"
    if "num_shards" in case:
        template = f"gs://{gcs_bucket}/dst/train-{{index:05d}}-of-{{num_shards:05d}}.tfrecord"
    summary = reshard(
        f"s3://{s3_bucket}/src/in-*",
        template,
        src_storage_options=s3_server.storage_options,
        dst_storage_options=gcs_server.storage_options,
        progress=False,
        **case,
    )
    listed = [f"gs://{gcs_bucket}/{name}" for name in gcs_server.list(gcs_bucket)]
    indexed = case.get("index", False)
    check_output(summary, collections.Counter(records), gcs_server.storage_options, listed, indexed)
    if "num_shards" in case:
        assert summary.shards[-1].endswith("train-00007-of-00008.tfrecord")


def test_s3_to_azure_indexed(
    s3_server: MotoS3Server, s3_bucket: str, azure_server: AzuriteServer, azure_container: str
) -> None:
    records = make_records(salt="a")
    for name, data in input_files(records).items():
        s3_server.put(s3_bucket, f"src/{name}", data)
    options = azure_server.storage_options
    summary = reshard(
        f"s3://{s3_bucket}/src/in-*",
        f"az://{azure_container}/dst/train-{{index:05d}}.tfrecord",
        src_storage_options=s3_server.storage_options,
        dst_storage_options=options,
        progress=False,
        max_bytes=4000,
        task_bytes=7000,
        compression="gzip",
        index=True,
    )
    listed = [f"az://{azure_container}/{name}" for name in azure_server.list(azure_container)]
    manifest = check_output(summary, collections.Counter(records), options, listed, indexed=True)
    assert [e.version for e in manifest.shards] == [
        azure_server.etag(azure_container, e.url.split("/", 3)[3]) for e in manifest.shards
    ]
    assert azure_server.uncommitted(azure_container) == []


def test_azure_to_gcs(
    azure_server: AzuriteServer, azure_container: str, gcs_server: FakeGcsServer, gcs_bucket: str
) -> None:
    records = make_records(salt="z")
    for name, data in input_files(records).items():
        azure_server.put(azure_container, f"src/{name}", data)
    summary = reshard(
        f"az://{azure_container}/src/in-*",
        f"gs://{gcs_bucket}/dst/train-{{index:05d}}-of-{{num_shards:05d}}.tfrecord",
        src_storage_options=azure_server.storage_options,
        dst_storage_options=gcs_server.storage_options,
        progress=False,
        num_shards=4,
        compression="zlib",
        shuffle=True,
    )
    listed = [f"gs://{gcs_bucket}/{name}" for name in gcs_server.list(gcs_bucket)]
    check_output(summary, collections.Counter(records), gcs_server.storage_options, listed)
    assert summary.shards[-1].endswith("train-00003-of-00004.tfrecord")


# ----------------------------------------------------------------------------------------------
# the command line, and a SIGKILL half-way


def run_cli(args: list[str], kill_after: int | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m streamrec.cli.reshard ARGS`` in a subprocess; with ``kill_after``, the process
    sends itself SIGKILL once it has committed that many output shards (support.reshard_crash)."""
    command = [sys.executable, "-m", "streamrec.cli.reshard"]
    if kill_after is not None:
        crash = ["support.reshard_crash", f"--kill-after={kill_after}", "--"]
        command = [sys.executable, "-m", *crash]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])},
        timeout=120,
    )


def test_cli_summary_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = write_local(tmp_path / "in", input_files(make_records()))
    out = f"{tmp_path}/out/p-{{index:03d}}.tfrecord"
    assert cli_main([sources, out, "--max-bytes", "4KiB", "--task-bytes", "8KiB"]) == 0
    text = capsys.readouterr().out
    assert "240 records" in text and "MB/s" in text and "_manifest.json" in text
    assert cli_main([sources, out, "--max-bytes", "4KiB", "--task-bytes", "8KiB", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["records"] == 240 and document["manifest_url"].endswith("_manifest.json")
    assert {"bytes_in", "bytes_out", "seconds", "mb_per_s", "shards"} <= set(document)
    assert cli_main([f"{tmp_path}/missing/*", out]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("streamrec reshard: error:") and "missing" in err and "\n" not in err
    assert cli_main([sources, out, "--num-shards", "2", "--max-records", "4"]) == 2
    assert cli_main([sources, f"{tmp_path}/x.tfrecord", "--max-records", "4"]) == 2
    assert "{index}" in capsys.readouterr().err
    for bad in (["--max-bytes", "12parsecs"], ["--num-shards", "0"], ["--engine", "spark"]):
        with pytest.raises(SystemExit) as info:
            cli_main([sources, out, *bad])
        assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        cli_main(["--help"])
    assert info.value.code == 0
    assert "examples:" in capsys.readouterr().out


@pytest.mark.slow  # a killed process and a rerun, seconds each
@pytest.mark.parametrize("index", [False, True], ids=["", "index"])
def test_sigkill_half_way_then_rerun_gives_the_uninterrupted_output(
    tmp_path: Path, s3_server: MotoS3Server, s3_bucket: str, index: bool
) -> None:
    records = make_records(300, salt="k")
    sources = write_local(tmp_path / "in", input_files(records[:240]))
    for name, data in zip(["in-06.tfrecord"], framed_shards(records[240:], [60]), strict=True):
        (tmp_path / "in" / name).write_bytes(data)
    options = json.dumps(s3_server.storage_options)
    common = ["--max-records", "20", "--task-bytes", "3KiB", "--compression", "gzip"]
    common += ["--dst-storage-options", options, "--json", *(["--index"] if index else [])]

    def template(prefix: str) -> str:
        return f"s3://{s3_bucket}/{prefix}/part-{{index:04d}}.tfrecord"

    reference = run_cli([sources, template("ref"), *common])
    assert reference.returncode == 0, reference.stderr
    ref = json.loads(reference.stdout)
    assert ref["tasks"] >= 4 and len(ref["shards"]) >= 12

    killed = run_cli([sources, template("run"), *common], kill_after=7)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    keys = s3_server.list(s3_bucket, "run/")
    assert "run/_manifest.json" not in keys
    shards_then = [k for k in keys if k.endswith(".tfrecord")]
    assert 7 <= len(shards_then) < len(ref["shards"])
    assert any("/_reshard/" in k for k in keys)  # at least one task had finished

    resumed = run_cli([sources, template("run"), *common])
    assert resumed.returncode == 0, resumed.stderr
    again = json.loads(resumed.stdout)
    assert 1 <= again["tasks_skipped"] < again["tasks"]
    assert again["bytes_read"] < ref["bytes_read"]
    opts = s3_server.storage_options
    got = relative(
        asyncio.run(load_manifest(again["manifest_url"], opts)), f"s3://{s3_bucket}/run/"
    )
    want = relative(asyncio.run(load_manifest(ref["manifest_url"], opts)), f"s3://{s3_bucket}/ref/")
    assert got == want  # same names, order, counts, sizes and CRCs: same bytes
    keys = s3_server.list(s3_bucket, "run/")
    sidecars = [f"run/{row[0]}.idx" for row in got] if index else []
    sidecars += ["run/_dataset_index.bin"] if index else []
    assert sorted(keys) == sorted(
        ["run/_manifest.json", *(f"run/{row[0]}" for row in got), *sidecars]
    )
    listed = [f"s3://{s3_bucket}/{key}" for key in keys]
    summary = ReshardSummary(**{k: v for k, v in again.items() if k != "mb_per_s"})
    check_output(summary, collections.Counter(records), opts, listed, index)
    if index:  # the same sidecars as the uninterrupted run's
        for row in got:
            assert s3_server.get(s3_bucket, f"run/{row[0]}.idx") == s3_server.get(
                s3_bucket, f"ref/{row[0]}.idx"
            )
    assert s3_server.list_multipart_uploads(s3_bucket) == []


def test_output_names_are_said_at_the_start_and_global_for_one_task(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = write_local(tmp_path / "in", input_files(make_records()))
    one = f"{tmp_path}/one/p-{{index:03d}}.tfrecord"
    assert cli_main([sources, one, "--max-records", "100"]) == 0  # all input in one task
    assert capsys.readouterr().err == (
        f"streamrec reshard: output names: {tmp_path}/one/p-000.tfrecord, "
        f"{tmp_path}/one/p-001.tfrecord, ... ({{index}} counts the shards: the input is one task)\n"
    )
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == [
        "_manifest.json",
        "p-000.tfrecord",
        "p-001.tfrecord",
        "p-002.tfrecord",
    ]
    several = f"{tmp_path}/several/p-{{index:03d}}.tfrecord"
    assert cli_main([sources, several, "--max-bytes", "4KiB", "--task-bytes", "8KiB"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(
        f"streamrec reshard: output names: {tmp_path}/several/p-000-000.tfrecord, "
        f"{tmp_path}/several/p-000-001.tfrecord, ..., {tmp_path}/several/p-001-000.tfrecord, ... "
        "({index} is written '<task>-<shard of the task>': the "
    )
    assert err.count("\n") == 1
    fixed = f"{tmp_path}/fixed/p-{{index:03d}}-of-{{num_shards:03d}}.tfrecord"
    assert cli_main([sources, fixed, "--num-shards", "4"]) == 0
    assert capsys.readouterr().err == (
        f"streamrec reshard: output names: {tmp_path}/fixed/p-000-of-004.tfrecord .. "
        f"{tmp_path}/fixed/p-003-of-004.tfrecord\n"
    )


def write_set_with_manifest(root: Path, records: list[bytes], per_shard: int) -> str:
    """A writer's set (shards + _manifest.json with record counts); returns the manifest."""
    with streamrec.sync.open_writer(
        str(root / "part-{index:03d}.tfrecord"), max_records=per_shard
    ) as writer:
        writer.write_many(records)
    return str(root / "_manifest.json")


def test_index_is_global_across_tasks_when_input_manifests_give_the_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = make_records(500)
    source = write_set_with_manifest(tmp_path / "in", records, per_shard=37)  # 14 inputs
    out = f"{tmp_path}/out/p-{{index:03d}}.tfrecord"
    args = [source, out, "--max-records", "40", "--task-bytes", "4KiB"]
    assert cli_main(args) == 0
    err = capsys.readouterr().err
    assert "{index} counts the shards: the " in err and "record counts are known" in err
    shards = asyncio.run(streamrec.read_manifest(f"{tmp_path}/out/_manifest.json"))
    names = [Path(entry.url).name for entry in shards]
    assert len({e.url for e in shards}) == len(names) > 13  # several tasks' shards
    assert names == [f"p-{k:03d}.tfrecord" for k in range(len(names))]  # 0, 1, 2, ... in order
    assert [entry.index for entry in shards] == list(range(len(names)))
    assert payloads([e.url for e in shards]) == collections.Counter(records)
    # without counts (a glob of the same files) the tasks number their own shards
    glob = str(tmp_path / "in" / "part-*.tfrecord")
    assert cli_main([glob, f"{tmp_path}/own/p-{{index:03d}}.tfrecord", *args[2:]]) == 0
    assert "'<task>-<shard of the task>'" in capsys.readouterr().err


def test_a_manifest_whose_counts_lie_cannot_make_two_tasks_share_a_name(tmp_path: Path) -> None:
    records = make_records(200)
    source = write_set_with_manifest(tmp_path / "in", records, per_shard=50)
    document = json.loads(Path(source).read_text())
    document["shards"][0]["records"] = 10  # 50 in truth: its task would write too many shards
    document["records"] -= 40  # (the total agrees, as a careful forger would make it)
    Path(source).write_text(json.dumps(document))
    lie = r"part-000.tfrecord: .* hold at least \d+ records, but their manifests say 10"
    with pytest.raises(streamrec.errors.FormatError, match=lie):
        reshard(
            source,
            f"{tmp_path}/out/p-{{index:03d}}.tfrecord",
            max_records=5,
            task_bytes=1,
            progress=False,
        )
    assert not (tmp_path / "out" / "_manifest.json").exists()
