"""Write the persisted artifacts of the streamrec found first on the path, for the compat tests.

Run with an *earlier* tree's code (see README.md), in an empty directory that becomes
``tests/data/compat/<version>/``::

    git worktree add /tmp/old-<sha> <sha>
    (cd /tmp/old-<sha> && python setup.py build_ext --inplace -q)
    mkdir out && cd out && PYTHONPATH=/tmp/old-<sha> python .../generate.py <sha>

Everything is written with relative urls (the states record the urls as given), so the test
reads them from a copy of the directory made its working directory. Whatever the tree cannot do
(no sidecars, no mix, ...) is left out; ``meta.json`` says what is there. This file runs against
old trees: it uses only public API and probes for what exists.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
import sys
from typing import Any

import streamrec
import streamrec.sync

RECORDS = 40
STOP = 11  # records (or batches) read before a state is taken
URL_LIST = [f"plain/part-{k:03d}.tfrecord" for k in range(6)] + [
    f"gzip/part-{k:03d}.tfrecord.gz" for k in range(6)
]


def payload(i: int) -> bytes:
    return b"r%05d-" % i + bytes(random.Random(i).randrange(24))


def ident(record: bytes) -> int:
    return int(record[1:6])


def write_set(directory: str, compression: str | None, index: bool) -> bool:
    """A set of 6 shards and its manifest; with sidecars where the tree writes them."""
    suffix = {None: "", "gzip": ".gz"}[compression]
    template = f"{directory}/part-{{index:03d}}.tfrecord{suffix}"
    kwargs: dict[str, Any] = {"max_records": 7, "compression": compression}
    try:
        writer = streamrec.sync.open_writer(template, index=index, **kwargs)
    except TypeError:  # a tree before sidecars
        index, writer = False, streamrec.sync.open_writer(template, **kwargs)
    with writer as w:
        for i in range(RECORDS):
            w.write(payload(i))
    return index


def ids(items: Any) -> list[int]:
    out: list[int] = []
    for item in items:
        if isinstance(item, (list, tuple)):
            out += [ident(r) for r in item]
        else:
            out.append(ident(item))
    return out


def take(ds: Any, stop: int | None) -> tuple[list[Any], Any]:
    got: list[Any] = []
    it = iter(ds)
    if stop is not None:
        for item in it:
            got.append(item)
            if len(got) >= stop:
                break
    else:
        got = list(it)
    state = ds.state_dict()
    close = getattr(it, "close", None)
    if close is not None:
        close()
    return got, state


def build(spec: dict[str, Any]) -> Any:
    """The dataset a state spec describes (the test builds the same with today's code)."""
    if "mix" in spec:
        parts = [build(part) for part in spec["mix"]]
        return streamrec.mix(parts, spec["weights"], seed=spec["seed"], stop=spec["stop"])
    ds = streamrec.open_dataset(spec["url"], **spec.get("kwargs", {}))
    for name, *args in spec.get("then", []):
        ds = getattr(ds, name)(*args)
    return ds


def states(indexed: bool) -> dict[str, dict[str, Any]]:
    plain = "plain/part-*.tfrecord"
    specs: dict[str, dict[str, Any]] = {
        "sequential": {"url": plain},
        "manifest": {"url": "plain/_manifest.json"},
        "interleaved": {"url": plain, "kwargs": {"cycle_length": 3, "block_length": 2}},
        "first-ready": {"url": plain, "kwargs": {"cycle_length": 3, "deterministic": False}},
        "shuffle-buffer": {
            "url": plain,
            "kwargs": {"cycle_length": 2, "shuffle_buffer": 7, "seed": 3},
        },
        "shuffle-shards": {"url": plain, "kwargs": {"shuffle_shards": True, "seed": 1}},
        "host-split": {"url": plain, "kwargs": {"num_hosts": 2, "host_index": 1}},
        "gzip": {"url": "gzip/part-*.tfrecord.gz", "kwargs": {"shuffle_buffer": 5, "seed": 2}},
        "batch": {"url": plain, "then": [["batch", 4]], "take": 3},
        "skip-take": {"url": plain, "then": [["skip", 3], ["take", 30]]},
        "unbatch": {"url": plain, "then": [["batch", 3], ["unbatch"]], "take": 13},
        "repeat": {
            "url": plain,
            "kwargs": {"shuffle_shards": True},
            "then": [["repeat", 2]],
            "take": 50,
        },
        # a list of shard urls (both sets: long enough to be named by a digest from state
        # version 3 on; earlier versions listed every url)
        "url-list": {"url": URL_LIST},
        "url-list-ready": {
            "url": URL_LIST,
            "kwargs": {"cycle_length": 3, "deterministic": False},
            "take": 40,
        },
        "url-list-buffer": {"url": URL_LIST, "kwargs": {"shuffle_buffer": 6, "seed": 4}},
        "mix": {
            "mix": [{"url": plain}, {"url": "gzip/part-*.tfrecord.gz"}],
            "weights": [0.7, 0.3],
            "seed": 5,
            "stop": "all",
        },
    }
    if indexed:
        specs["global"] = {"url": plain, "kwargs": {"shuffle": "global", "seed": 3}}
        specs["block"] = {
            "url": plain,
            "kwargs": {"shuffle": "block", "seed": 3, "window_records": 4},
        }
        specs["even-pad"] = {
            "url": plain,
            "kwargs": {"even": "pad", "num_hosts": 3, "host_index": 2},
        }
        specs["global-gzip"] = {"url": "gzip/part-*.tfrecord.gz", "kwargs": {"shuffle": "global"}}
        specs["url-list-global"] = {"url": URL_LIST, "kwargs": {"shuffle": "global", "seed": 2}}
    return specs


def write_states(indexed: bool) -> list[str]:
    os.makedirs("states", exist_ok=True)
    written = []
    for name, spec in states(indexed).items():
        try:
            stop = spec.get("take", STOP)
            head, state = take(build(spec), stop)
            everything, _ = take(build(spec), None)
        except Exception as exc:  # this tree cannot: leave it out (meta.json lists what is)
            print(f"state {name}: skipped ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        document = {
            "dataset": spec,
            "stop": stop,
            "head": ids(head),
            "all": ids(everything),
            "state": state,
        }
        with open(f"states/{name}.json", "w") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
        written.append(name)
    if indexed and hasattr(streamrec, "merge_states"):
        # elastic resume: two consumers' states, merged, continued by any number
        spec = {"url": "plain/part-*.tfrecord", "kwargs": {"shuffle": "global", "seed": 4}}
        parts, heads = [], []
        for host, stop in ((0, 6), (1, 9)):
            one = {
                "url": spec["url"],
                "kwargs": {**spec["kwargs"], "num_hosts": 2, "host_index": host},
            }
            head, state = take(build(one), stop)
            parts.append(state)
            heads += ids(head)
        document = {"dataset": spec, "head": heads, "states": parts}
        with open("states/consumers-2.json", "w") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
        written.append("consumers-2")
    return written


def write_reshard() -> dict[str, Any] | None:
    """A reshard interrupted after all but its last task: the task manifests of the done
    tasks and their shards, no final manifest."""
    fn = streamrec.reshard
    job = sys.modules[fn.__module__]
    job.delete_objects = _keep  # type: ignore[attr-defined]  # keep the task manifests
    kwargs: dict[str, Any] = {"max_records": 9, "task_bytes": 200, "progress": False}
    summary = fn("plain/part-*.tfrecord", "reshard/part-{index:03d}.tfrecord", **kwargs)
    os.remove(summary.manifest_url)
    scratch = sorted(
        os.path.join(root, name) for root, _, names in os.walk("reshard/_reshard") for name in names
    )
    os.remove(scratch[-1])  # the last task did not finish
    return {
        "sources": "plain/part-*.tfrecord",
        "template": "reshard/part-{index:03d}.tfrecord",
        "kwargs": kwargs,
        "tasks": summary.tasks,
        "done": len(scratch) - 1,
        "task_manifests": scratch[:-1],
    }


async def _keep_async(urls: Any, options: Any) -> None:
    return None


def _keep(urls: Any, options: Any) -> Any:
    return _keep_async(urls, options)


def write_cache() -> dict[str, Any] | None:
    """A published cache entry of a remote object, as this tree lays it out."""
    try:
        from streamrec.storage.base import ObjectInfo
        from streamrec.storage.cache.store import ShardCache, cache_namespace
    except ImportError:
        return None
    with open("plain/part-000.tfrecord", "rb") as f:
        data = f.read()
    url, options = "s3://bucket/data/part-000.tfrecord", {"endpoint_url": "http://127.0.0.1:9"}
    namespace = cache_namespace(url, options)
    obj = ObjectInfo(url, len(data), '"0123456789abcdef"')

    async def fill() -> None:
        cache = ShardCache("cache", 1 << 20)
        entry = await cache.open(obj, namespace)
        for step in (lambda: entry.write(0, [data]), entry.publish):
            done = step()
            if inspect.isawaitable(done):
                await done

    asyncio.run(fill())
    return {
        "url": url,
        "storage_options": options,
        "namespace": namespace,
        "size": len(data),
        "version": obj.version,
        "source": "plain/part-000.tfrecord",
        "entries": sorted(os.listdir("cache")),
    }


def write_checks() -> dict[str, Any] | None:
    """A host's record of index checks (``checks-root/checks/*.checks``) of a dataset of two
    versioned S3 shards, the second's first 5 entries recorded as verified."""
    try:
        from streamrec.pipeline.indexed.host_checks import HostChecks
        from streamrec.storage.base import ObjectInfo
    except ImportError:
        return None
    urls = ["s3://bucket/data/part-000.tfrecord", "s3://bucket/data/part-001.tfrecord"]
    slot = {"slot": 1, "url": urls[1], "size": 4096, "version": '"etag-1"', "entries": 5}
    slot["index_digest"] = "00112233445566778899aabbccddeeff"
    os.makedirs("checks-root", mode=0o700)
    shards = [ObjectInfo(url, 4096, '"etag-1"') for url in urls]
    record = HostChecks.for_dataset("checks-root", shards)
    assert record is not None
    key = (urls[1], 4096, '"etag-1"', bytes.fromhex(slot["index_digest"]))
    record.record(1, key, 5)
    return {"root": "checks-root", "urls": urls, "slots": [slot]}


def main() -> None:
    commit = sys.argv[1]
    indexed = write_set("plain", None, index=True)
    write_set("gzip", "gzip", index=True)
    meta: dict[str, Any] = {
        "commit": commit,
        "streamrec": getattr(streamrec, "__version__", None),
        "sidecars": indexed,
        "states": write_states(indexed and hasattr(streamrec, "merge_states")),
    }
    meta["reshard"] = write_reshard()
    meta["cache"] = write_cache()
    meta["checks"] = write_checks()
    with open("meta.json", "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    sys.stdout.flush()
    os._exit(0)  # an abandoned iterator of an old tree may keep the process alive at exit


if __name__ == "__main__":
    main()
