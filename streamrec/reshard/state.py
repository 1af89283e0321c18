"""What a reshard keeps in the destination: per-task manifests, the final manifest, clean-up.

Per-task manifests are ordinary streamrec manifests (:mod:`streamrec.manifest.core`) listing one
task's output shards (indexes local to the task), stored under
``<output dir>/_reshard/<fingerprint>/task-NNNNN.json``. One is written only after every shard
of its task is committed, so its presence (with every listed shard present at its listed size)
means the task is done. The final ``_manifest.json`` is written last and lists every shard with
its global index (with ``index=True``, the dataset index ``_dataset_index.bin`` just before
it); the per-task manifests are then removed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
from collections.abc import Sequence
from typing import Any

from streamrec._portal import run_all
from streamrec.errors import FormatError, ObjectNotFoundError, StorageError
from streamrec.format.codecs import Compression
from streamrec.format.index.core import index_url
from streamrec.format.index.dataset import (
    DATASET_INDEX_NAME,
    EncodedShard,
    dataset_index_bytes,
    encode_shard,
)
from streamrec.manifest.check import invalidate_manifest
from streamrec.manifest.core import (
    Manifest,
    ManifestEntry,
    dumps,
    loads,
    manifest_for,
    relative_name,
)
from streamrec.pipeline.listing.sidecars import load_index
from streamrec.reshard.plan import PLAN_VERSION, Naming, Plan, TaskSpec
from streamrec.storage.base import ObjectInfo, ObjectStore, split_scheme
from streamrec.storage.leftovers import find_leftovers, remove_leftover
from streamrec.storage.registry import open_store
from streamrec.storage.retry import RetryPolicy
from streamrec.storage.sink_base import SinkContext

__all__ = [
    "delete_objects",
    "load_done_tasks",
    "remove_manifest",
    "same_url",
    "write_dataset_index",
    "write_manifest",
]

logger = logging.getLogger("streamrec")

_ALIASES = {"s3a": "s3", "gcs": "gs", "file": ""}
_CHECKS_AT_ONCE = 16


def same_url(url: str) -> str:
    """A canonical spelling of ``url`` for comparisons (scheme aliases, absolute local paths)."""
    scheme, rest = split_scheme(url)
    scheme = _ALIASES.get(scheme, scheme)
    if not scheme:
        return os.path.abspath(rest)
    return f"{scheme}://{rest}"


async def write_manifest(
    url: str,
    entries: Sequence[ManifestEntry],
    *,
    compression: str | None,
    template: str | None,
    storage_options: dict[str, Any] | None,
    scratch: bool = False,
    retry: RetryPolicy | None = None,
) -> None:
    """Write the manifest of ``entries`` at ``url`` (atomically: it appears complete).

    ``scratch``: a per-task manifest, below the output directory, listing its shards by url
    (only this module reads it back, checking every name against the plan).
    """
    manifest = manifest_for(entries, compression=compression, template=template)
    store = open_store(url, storage_options)
    try:
        sink = store.open_sink(url, SinkContext(retry=retry or RetryPolicy()))
        await sink.write(dumps(manifest, url, allow_absolute_urls=scratch))
        await sink.commit()
    finally:
        await store.close()


async def remove_manifest(
    url: str, storage_options: dict[str, Any] | None, retry: RetryPolicy | None = None
) -> None:
    """Remove the final manifest of an earlier run before this one rewrites its shards (see
    :func:`~streamrec.manifest.check.invalidate_manifest`)."""
    store = open_store(url, storage_options)
    policy = retry or RetryPolicy()
    try:
        await invalidate_manifest(store, url, policy)
        index = _dataset_index_url(url)  # it would describe the shards rewritten now
        try:
            await policy.run(lambda: store.expand(index), describe=f"{index}: looking it up")
        except ObjectNotFoundError:
            return
        await policy.run(lambda: store.delete(index), describe=f"{index}: removing it")
    finally:
        await store.close()


def _dataset_index_url(manifest_url: str) -> str:
    return f"{manifest_url.rpartition('/')[0]}/{DATASET_INDEX_NAME}"


async def write_dataset_index(
    manifest_url: str,
    entries: Sequence[ManifestEntry],
    *,
    compression: Compression,
    storage_options: dict[str, Any] | None,
    retry: RetryPolicy | None = None,
) -> str | None:
    """Write the dataset index of ``entries`` (each with its sidecar: ``index=True``) beside
    the final manifest, before it; its url (None: a shard has no sidecar, or lies outside the
    manifest's directory). The sidecars are read once each, a few at a time, and each kept as
    its entries (a byte or two a record)."""
    names = [relative_name(entry.url, manifest_url) for entry in entries]
    if any(e.index_url is None or e.index_bytes is None for e in entries) or None in names:
        return None
    policy = retry or RetryPolicy()
    url = _dataset_index_url(manifest_url)
    store = open_store(url, storage_options)
    gate = asyncio.Semaphore(_CHECKS_AT_ONCE)

    async def encoded(entry: ManifestEntry, name: str) -> EncodedShard:
        assert entry.index_url is not None and entry.index_bytes is not None
        shard = ObjectInfo(entry.url, entry.bytes, entry.version)
        async with gate:
            index = await load_index(
                shard,
                ObjectInfo(entry.index_url, entry.index_bytes),
                store,
                policy,
                compressed=compression is not None,
            )
        return encode_shard(name, entry.bytes, entry.version, compression, index)

    try:
        shards = await run_all(
            encoded(e, n) for e, n in zip(entries, names, strict=True) if n is not None
        )
        sink = store.open_sink(url, SinkContext(retry=policy))
        await sink.write(dataset_index_bytes(shards))
        await sink.commit()
    finally:
        await store.close()
    return url


async def load_done_tasks(
    plan: Plan, storage_options: dict[str, Any] | None, retry: RetryPolicy | None = None
) -> dict[int, list[ManifestEntry]]:
    """The tasks of ``plan`` already done by an earlier run: task index -> its shards.

    A task counts as done when its manifest parses, lists exactly the shard names the plan
    gives it (with their index sidecars when the job indexes), and every shard and sidecar
    exists with the listed size. Anything else (no manifest, a
    damaged one, a missing shard) means the task is run again.
    """
    policy = retry or RetryPolicy()
    pattern = plan.naming.scratch_glob(plan.fingerprint)
    store = open_store(pattern, storage_options)
    try:
        try:
            found = await policy.run(lambda: store.expand(pattern), describe=f"listing {pattern}")
        except ObjectNotFoundError:
            await _report_other_jobs(store, plan)
            return {}
        by_url = {same_url(info.url): info for info in found}
        checks = asyncio.Semaphore(_CHECKS_AT_ONCE)
        candidates = [
            (task, by_url[same_url(task.scratch_url)])
            for task in plan.tasks
            if same_url(task.scratch_url) in by_url
        ]
        results = await run_all(
            _check_task(store, task, info, plan, policy, checks) for task, info in candidates
        )
    finally:
        await store.close()
    return {
        task.index: entries
        for (task, _), entries in zip(candidates, results, strict=True)
        if entries
    }


async def _report_other_jobs(store: ObjectStore, plan: Plan) -> None:
    """Say why the task manifests of another job in the destination are not reused (an
    interrupted run with other inputs or arguments, or by a streamrec whose plan version
    differs: its tasks may be cut or named otherwise). Best effort: a failure is ignored."""
    pattern = plan.naming.scratch_glob("*")
    try:
        found = await store.expand(pattern)
    except (StorageError, ValueError):
        return
    jobs = sorted({posixpath.dirname(info.url) for info in found})
    for job in jobs:
        logger.warning(
            "%s: task manifests of another reshard job (other inputs or arguments, or an "
            "earlier streamrec's plan, version %s now), not reused: every task of this job "
            "(%s) runs; remove that directory once it is not needed",
            job,
            PLAN_VERSION,
            plan.fingerprint,
        )


async def _check_task(
    store: ObjectStore,
    task: TaskSpec,
    info: ObjectInfo,
    plan: Plan,
    policy: RetryPolicy,
    checks: asyncio.Semaphore,
) -> list[ManifestEntry] | None:
    url = task.scratch_url
    async with checks:
        try:
            data = await policy.run(
                lambda: store.read_range(info, 0, info.size), describe=f"{url}: reading"
            )
        except StorageError as exc:
            logger.warning("%s: cannot read the task manifest, redoing the task: %s", url, exc)
            return None
    if len(data) != info.size:
        return None
    try:
        # a task manifest lists its shards by url as the job spelled them (they are never
        # below it): a relative one is relative to the working directory, not to the
        # manifest; _matches checks each against the plan
        manifest = loads(data, url, allow_absolute_urls=True, directory="")
    except FormatError as exc:
        logger.warning("%s: redoing the task: %s", url, exc)
        return None
    if not _matches(manifest, task, plan):
        logger.warning("%s: lists other shards than this job writes; redoing the task", url)
        return None

    async def present(url: str, size: int | None) -> bool:
        async with checks:
            try:
                [obj] = await policy.run(lambda: store.expand(url), describe=f"{url}: checking")
            except (StorageError, ValueError):
                return False
            return obj.size == size

    objects: list[tuple[str, int | None]] = [(e.url, e.bytes) for e in manifest.shards]
    objects += [(e.index_url, e.index_bytes) for e in manifest.shards if e.index_url is not None]
    there = await run_all(present(url, size) for url, size in objects)
    if not all(there):
        logger.warning("%s: a shard it lists is missing or changed; redoing the task", url)
        return None
    return manifest.shards


def _matches(manifest: Manifest, task: TaskSpec, plan: Plan) -> bool:
    if manifest.compression != plan.compression:
        return False
    for entry in manifest.shards:  # indexed exactly when the job indexes, each beside its shard
        sidecar = None if entry.index_url is None else same_url(entry.index_url)
        if sidecar != (same_url(index_url(entry.url)) if plan.index else None):
            return False
    names = [same_url(entry.url) for entry in manifest.shards]
    if task.outputs:
        return names == [same_url(url) for url in task.outputs]
    template = task.writer_template
    assert template is not None
    return names == [same_url(template.format(index=j)) for j in range(len(names))]


async def delete_objects(urls: Sequence[str], storage_options: dict[str, Any] | None) -> None:
    """Remove ``urls`` (best effort: a failure is logged, never raised)."""
    if not urls:
        return
    store = open_store(urls[0], storage_options)
    try:
        for url in urls:
            try:
                await _delete(store, url)
            except Exception as exc:  # scratch left behind is harmless: log and go on
                logger.warning("%s: could not remove: %s", url, exc)
    finally:
        await store.close()
    local = [u for u in urls if split_scheme(u)[0] == "file"]
    for directory in sorted({os.path.dirname(split_scheme(u)[1]) for u in local}):
        try:  # the job's scratch directory, and _reshard/ when nothing else is in it
            os.rmdir(directory)
            os.rmdir(os.path.dirname(directory))
        except OSError:
            pass


async def _delete(store: ObjectStore, url: str) -> None:
    await store.delete(url)


async def abort_unfinished_writes(naming: Naming, storage_options: dict[str, Any] | None) -> int:
    """Abort the writes a killed earlier run left open for this job's output shards (S3
    multipart uploads, local temporary files): a rerun knows its own names. Returns how many."""
    prefix = (naming.directory or ".").rstrip("/") + "/"
    store = open_store(prefix, storage_options)
    try:
        found = [f for f in await find_leftovers(store, prefix) if naming.matches_output(f.url)]
        for leftover in found:
            logger.warning(
                "%s: aborting the %s an earlier, killed run left (started %.0f s ago)",
                leftover.url,
                leftover.kind,
                leftover.age_s(),
            )
            await remove_leftover(store, leftover)
        return len(found)
    finally:
        await store.close()
