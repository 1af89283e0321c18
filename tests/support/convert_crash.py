"""Fault hooks for the ``streamrec convert`` crash tests, installed through the seams
``streamrec.convert.to_parquet.after_file_stored`` (``--to parquet``) and
``streamrec.reshard.task.after_shard_committed`` (``--from parquet`` runs reshard tasks);
both ``None`` in production.

``install(marker=..., fail_task=...)`` sets them in the process that calls it: in this
process for the local engine, or on every worker of a running Dask cluster with
``client.run(install, ...)`` (a worker restarted after dying starts without them, which is
what ``exit_once`` wants). ``install()`` with no argument removes them.

* ``marker``: the first task (over all processes) that has stored a file or committed a shard
  creates ``marker`` and ends its process with ``os._exit(70)`` before its task state (see
  :func:`support.reshard_crash.exit_once`); later attempts find ``marker`` and carry on.
* ``fail_task``: task ``fail_task`` raises :class:`Interrupted` once it has stored a file or
  committed a shard (an interrupted job: the tasks before it are done, it is half done).
"""

from __future__ import annotations

import os

from streamrec.convert import to_parquet
from streamrec.reshard import task
from streamrec.reshard.plan import TaskSpec
from support.reshard_crash import exit_once

__all__ = ["Interrupted", "install"]


class Interrupted(RuntimeError):
    """What a task raises where ``fail_task`` interrupts the job."""


def install(marker: str | os.PathLike[str] | None = None, fail_task: int | None = None) -> None:
    """Set both seams in this process (none of the two: unset them)."""
    if marker is None and fail_task is None:
        to_parquet.after_file_stored = None
        task.after_shard_committed = None
        return
    exit_hook = exit_once(marker) if marker is not None else None

    def check(spec: TaskSpec, written: int) -> None:
        if spec.index == fail_task and written >= 1:
            raise Interrupted(f"task {spec.index} interrupted after {written} output(s)")
        if exit_hook is not None:
            exit_hook(spec, written)

    to_parquet.after_file_stored = lambda number, files: check(TaskSpec(number, (), ""), files)
    task.after_shard_committed = check
