"""The Dask engine of :func:`streamrec.reshard.job` (and of ``streamrec convert``): one Dask task
per task of the job's plan.

Each reshard task runs :func:`streamrec.reshard.task.run_task_blocking` on a worker (its own event
loop and filesystems), writes its output shards under their deterministic names plus its task
manifest, and returns its manifest entries; the driver writes the final manifest. A task
whose worker dies is run again by Dask (``distributed.scheduler.allowed-failures``); the new
attempt writes the same objects under the same names, so nothing is duplicated.
``streamrec convert --to parquet`` hands in its own task runner (``run=``): the same cluster
handling, retries, cancellation and progress.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

__all__ = ["DaskEngineError", "run_on_dask"]


class _Numbered(Protocol):
    @property
    def index(self) -> int: ...


TaskT = TypeVar("TaskT", bound=_Numbered)
OptionsT = TypeVar("OptionsT")
ResultT = TypeVar("ResultT", bound=_Numbered)


class DaskEngineError(RuntimeError):
    """The Dask cluster failed the job (a task's worker died too often, the scheduler went
    away); errors raised by a task itself (damaged data, storage) pass through unchanged."""


def _distributed() -> Any:
    """``dask.distributed``, imported on first use (typed loosely: it ships no stubs)."""
    try:
        return importlib.import_module("dask.distributed")
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            'engine="dask" needs dask.distributed: pip install "streamrec[dask]"'
        ) from exc


def _client(scheduler: Any, workers: int) -> tuple[Any, list[Any]]:
    """A dask.distributed Client (and what to close afterwards)."""
    distributed = _distributed()
    Client = distributed.Client
    if scheduler is None:
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            host="127.0.0.1",
        )
        client = Client(cluster)
        return client, [client, cluster]
    if isinstance(scheduler, Client):
        return scheduler, []
    if isinstance(scheduler, str):
        client = Client(scheduler)
        return client, [client]
    raise TypeError(
        f"scheduler must be a scheduler address or a dask.distributed.Client, not "
        f"{type(scheduler).__name__}"
    )


def run_on_dask(
    tasks: Sequence[TaskT],
    options: OptionsT,
    *,
    scheduler: Any = None,
    workers: int = 2,
    on_done: Callable[[ResultT], None] | None = None,
    run: Callable[[TaskT, OptionsT], ResultT],
    name: str = "reshard",
) -> list[ResultT]:
    """Run ``tasks`` on a Dask cluster, ``run(task, options)`` each (a module-level function:
    it travels by name; a reshard's is :func:`~streamrec.reshard.task.run_task_blocking`);
    their results in task order.

    ``scheduler``: ``None`` (a LocalCluster of ``workers`` processes, one thread each, on
    loopback, closed afterwards), a scheduler address, or a ``Client``. The first task that
    fails cancels the rest and its error is raised here.
    """
    if not tasks:
        return []
    as_completed = _distributed().as_completed
    client, owned = _client(scheduler, workers)
    try:
        job = uuid.uuid4().hex[:8]
        futures = [
            client.submit(run, task, options, key=f"{name}-{job}-{task.index:05d}", pure=False)
            for task in tasks
        ]
        results: dict[int, ResultT] = {}
        try:
            for future in as_completed(futures):
                result: ResultT = future.result()
                results[result.index] = result
                if on_done is not None:
                    on_done(result)
        except BaseException as exc:
            client.cancel(futures)
            if type(exc).__module__.split(".")[0] in ("distributed", "dask"):
                raise DaskEngineError(f"dask: {type(exc).__name__}: {exc}") from exc
            raise
        return [results[task.index] for task in tasks]
    finally:
        for resource in owned:
            resource.close()
