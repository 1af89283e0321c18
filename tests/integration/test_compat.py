"""What earlier versions wrote stays readable: every artifact under tests/data/compat/, written
by that version's own code (see its README.md), read with today's.

Each version directory holds a small shard set with its manifest (plain, with ``.idx`` sidecars
where the version wrote them; gzip likewise), resume states of every kind the version had, an
interrupted reshard job and a shard cache entry. A persisted format changes only with a version
bump that keeps the old reader: a test here that fails means something the library wrote no
longer reads.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import streamrec
from streamrec.format.index.dataset import DATASET_INDEX_NAME, DatasetIndex
from streamrec.manifest.core import FORMAT, READ_FORMATS, loads

ROOT = Path(__file__).resolve().parents[1] / "data" / "compat"
VERSIONS = sorted(p.name for p in ROOT.iterdir() if (p / "meta.json").is_file())
RECORDS = 40


def ident(record: bytes) -> int:
    return int(record[1:6])


def ids(items: Any) -> list[int]:
    out: list[int] = []
    for item in items:
        out += [ident(r) for r in item] if isinstance(item, (list, tuple)) else [ident(item)]
    return out


def meta(version: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((ROOT / version / "meta.json").read_text())
    return document


@pytest.fixture
def old(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of one version's directory, made the working directory (its urls are relative:
    the states record them as given)."""
    copy = tmp_path / request.param
    shutil.copytree(ROOT / request.param, copy)
    monkeypatch.chdir(copy)
    return copy


def _load_generate() -> Any:
    """generate.py, the script that wrote these files, as a module (run with today's code)."""
    spec = importlib.util.spec_from_file_location("compat_generate", ROOT / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generate()
build = generate.build  # the dataset a state was taken from, as generate.py built it


def read_all(ds: Any) -> list[int]:
    it = iter(ds)
    try:
        return ids(it)
    finally:
        it.close()


def test_every_version_is_here() -> None:
    assert len(VERSIONS) >= 4
    markers = {
        json.loads((ROOT / v / "plain" / "_manifest.json").read_text())["format"] for v in VERSIONS
    }
    assert markers == set(READ_FORMATS)  # a manifest of every marker ever written
    assert FORMAT == "streamrec.manifest.core"  # a literal: never follows a module's name


@pytest.mark.parametrize("old", VERSIONS, indirect=True)
@pytest.mark.parametrize("subset", ["plain", "gzip"])
def test_manifests_read(old: Path, subset: str) -> None:
    path = old / subset / "_manifest.json"
    manifest = loads(path.read_bytes(), str(path))
    assert manifest.records == RECORDS and len(manifest.shards) == 6
    assert read_all(streamrec.open_dataset(f"{subset}/_manifest.json")) == list(range(RECORDS))


@pytest.mark.parametrize("old", VERSIONS, indirect=True)
@pytest.mark.parametrize("subset", ["plain", "gzip"])
def test_sidecars_give_counts_and_records(old: Path, subset: str) -> None:
    if not json.loads((old / "meta.json").read_text())["sidecars"]:
        pytest.skip("this version wrote no sidecars")
    pattern = f"{subset}/part-*"
    assert len(streamrec.open_dataset(pattern)) == RECORDS
    ds = streamrec.open_dataset(pattern)
    assert [ident(r) for r in ds.get([0, 17, 39, 3, 17])] == [0, 17, 39, 3, 17]
    # a global shuffle reads records by the index alone: every record once
    shuffled = read_all(streamrec.open_dataset(pattern, shuffle="global", seed=1))
    assert Counter(shuffled) == Counter(range(RECORDS))


@pytest.mark.parametrize("old", VERSIONS, indirect=True)
@pytest.mark.parametrize("subset", ["plain", "gzip"])
def test_dataset_indexes_read_alone(old: Path, subset: str) -> None:
    """``_dataset_index.bin`` (written since 2026-11-28): the same entries as the sidecars,
    and enough alone for counts, ``get()`` and a global shuffle."""
    path = old / subset / DATASET_INDEX_NAME
    if not path.exists():
        pytest.skip("this version wrote no dataset index")
    index = DatasetIndex(path.read_bytes(), source=str(path))
    for k, shard in enumerate(index.shards):
        assert index.shard_index(k).to_bytes() == (old / subset / f"{shard.name}.idx").read_bytes()
    for sidecar in (old / subset).glob("*.idx"):
        sidecar.unlink()
    (old / subset / "_manifest.json").unlink()
    ds = streamrec.open_dataset(f"{subset}/")
    assert len(ds) == RECORDS
    assert [ident(r) for r in ds.get([0, 17, 39, 3, 17])] == [0, 17, 39, 3, 17]
    shuffled = read_all(streamrec.open_dataset(f"{subset}/", shuffle="global", seed=1))
    assert Counter(shuffled) == Counter(range(RECORDS))


STATES = [
    pytest.param(version, path.stem, id=f"{version}-{path.stem}")
    for version in VERSIONS
    for path in sorted((ROOT / version / "states").glob("*.json"))
    if path.stem != "consumers-2"
]
UNORDERED = {"first-ready", "url-list-ready"}  # first-ready reading: as records arrive


@pytest.mark.parametrize(("old", "name"), STATES, indirect=["old"])
def test_states_resume_with_exactly_the_rest(old: Path, name: str) -> None:
    saved = json.loads((old / "states" / f"{name}.json").read_text())
    head, everything = saved["head"], saved["all"]
    ds = build(saved["dataset"])
    ds.load_state_dict(saved["state"])
    rest = read_all(ds)
    fresh = read_all(build(saved["dataset"]))
    if name in UNORDERED:
        assert Counter(head) + Counter(rest) == Counter(everything)
        assert Counter(fresh) == Counter(everything)
    else:
        assert head + rest == everything  # exactly what that version would have read on
        assert fresh == everything  # and today's order of a fresh read is the same


CONSUMERS = [
    pytest.param(version, id=version)
    for version in VERSIONS
    if (ROOT / version / "states" / "consumers-2.json").is_file()
]


@pytest.mark.parametrize("old", CONSUMERS, indirect=True)
def test_consumer_states_merge_and_continue(old: Path) -> None:
    saved = json.loads((old / "states" / "consumers-2.json").read_text())
    merged = streamrec.merge_states(saved["states"])
    rest: list[int] = []
    for host in range(3):  # continued by another number of consumers
        kwargs = {**saved["dataset"]["kwargs"], "num_hosts": 3, "host_index": host}
        ds = streamrec.open_dataset(saved["dataset"]["url"], **kwargs)
        ds.load_state_dict(merged)
        rest += read_all(ds)
    assert Counter(saved["head"]) + Counter(rest) == Counter(range(RECORDS))


RESHARDS = [pytest.param(v, id=v) for v in VERSIONS if meta(v).get("reshard")]


# Versions whose reshard plan had another PLAN_VERSION (2 until 2026-11-23 23:18, when tasks
# with known counts began numbering their shards globally): a deliberate bump, their task
# manifests are not reused, and the log says why.
OTHER_PLAN = {"2026-11-23-2f9d496"}


@pytest.mark.parametrize("old", RESHARDS, indirect=True)
def test_an_interrupted_reshard_resumes(old: Path, caplog: pytest.LogCaptureFixture) -> None:
    job = json.loads((old / "meta.json").read_text())["reshard"]
    with caplog.at_level(logging.WARNING, logger="streamrec"):
        summary = streamrec.reshard(job["sources"], job["template"], **job["kwargs"])
    if old.name in OTHER_PLAN:
        assert (summary.tasks, summary.tasks_skipped) == (job["tasks"], 0)
        assert "task manifests of another reshard job" in caplog.text
        assert "plan, version 3 now" in caplog.text
    else:
        assert (summary.tasks, summary.tasks_skipped) == (job["tasks"], job["done"])
        assert "redoing the task" not in caplog.text
    assert read_all(streamrec.open_dataset(summary.manifest_url)) == list(range(RECORDS))


CACHES = [pytest.param(v, id=v) for v in VERSIONS if meta(v).get("cache")]


@pytest.mark.parametrize("old", CACHES, indirect=True)
def test_a_cache_entry_is_served(old: Path) -> None:
    from streamrec.storage.base import ObjectInfo
    from streamrec.storage.cache.store import CacheHit, ShardCache, cache_namespace

    entry = json.loads((old / "meta.json").read_text())["cache"]
    namespace = cache_namespace(entry["url"], entry["storage_options"])
    assert namespace == entry["namespace"]
    obj = ObjectInfo(entry["url"], entry["size"], entry["version"])

    async def served() -> bytes:
        hit = await ShardCache(str(old / "cache"), 1 << 20).open(obj, namespace, fill=False)
        assert isinstance(hit, CacheHit), hit
        try:
            return await hit.store.read_range(hit.obj, 0, hit.obj.size)
        finally:
            await hit.close()

    assert asyncio.run(served()) == (old / entry["source"]).read_bytes()


CHECKS = [pytest.param(v, id=v) for v in VERSIONS if meta(v).get("checks")]


@pytest.mark.parametrize("old", CHECKS, indirect=True)
def test_a_host_record_of_checks_is_believed(old: Path) -> None:
    from streamrec.pipeline.indexed.host_checks import HostChecks
    from streamrec.storage.base import ObjectInfo

    kept = json.loads((old / "meta.json").read_text())["checks"]
    for directory in (old / kept["root"], old / kept["root"] / "checks"):
        directory.chmod(0o700)  # a clone's directories get the umask's mode: maybe 0o775
    by_url = {slot["url"]: slot for slot in kept["slots"]}
    shards = [
        ObjectInfo(url, by_url[url]["size"], by_url[url]["version"])
        if url in by_url
        else ObjectInfo(url, 1, '"v"')
        for url in kept["urls"]
    ]
    record = HostChecks.for_dataset(str(old / kept["root"]), shards)
    assert record is not None
    for slot in kept["slots"]:
        digest = bytes.fromhex(slot["index_digest"])
        key = (slot["url"], slot["size"], slot["version"], digest)
        assert record.known(slot["slot"], key) == slot["entries"]
        other = (slot["url"], slot["size"] + 1, slot["version"], digest)
        assert record.known(slot["slot"], other) == 0


def shape(value: Any) -> Any:
    """The structure of a JSON value: keys and types, and every "version" and "kind"."""
    if isinstance(value, dict):
        return {
            k: (v if k in ("version", "kind", "format") else shape(v)) for k, v in value.items()
        }
    if isinstance(value, list):
        return sorted({json.dumps(shape(v), sort_keys=True) for v in value})
    return type(value).__name__


@pytest.mark.parametrize("old", VERSIONS[-1:], indirect=True)
def test_todays_writers_write_what_the_latest_files_hold(old: Path, tmp_path: Path) -> None:
    """A persisted format changes only with a version bump: today's code writes the same
    manifests, sidecars and state shapes as the newest directory here. When this fails on
    purpose, bump the format's version (keeping the old reader) and add a directory written
    by the new code (README.md)."""
    for subset, compression in (("plain", None), ("gzip", "gzip")):
        assert generate.write_set(f"new-{subset}", compression, index=True)
        for path in sorted((old / subset).iterdir()):
            new = old / f"new-{subset}" / path.name
            if path.suffix == ".json":
                written, kept = json.loads(new.read_text()), json.loads(path.read_text())
                for document in (written, kept):
                    del document["writer"]
                    for shard in document["shards"]:
                        shard["url"] = shard["url"].replace("new-", "")
                    document["template"] = document["template"].replace("new-", "")
                assert written == kept, path.name
            else:
                assert new.read_bytes() == path.read_bytes(), path.name
    for path in sorted((old / "states").glob("*.json")):
        saved = json.loads(path.read_text())
        if "state" not in saved:
            continue
        _, state = generate.take(build(saved["dataset"]), saved["stop"])
        assert same_shape(state, saved["state"]), path.name


def same_shape(written: Any, kept: Any) -> bool:
    """Whether two JSON values have one structure (see :func:`shape`); a list's items are
    compared only where both lists have some (which shards a first-ready state names as done
    depends on the order reads complete, not on the format)."""
    if isinstance(written, dict) and isinstance(kept, dict):
        if written.keys() != kept.keys():
            return False
        return all(
            written[k] == kept[k]
            if k in ("version", "kind", "format")
            else same_shape(written[k], kept[k])
            for k in written
        )
    if isinstance(written, list) and isinstance(kept, list):
        return not written or not kept or shape(written) == shape(kept)
    return shape(written) == shape(kept)
