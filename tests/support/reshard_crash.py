"""Crash hooks for the reshard crash tests, installed through the seam
``streamrec.reshard.task.after_shard_committed`` (``None`` in production: streamrec itself reads
no test setting, from the environment or anywhere else).

The hooks:

``kill_after(k)``
    the process sends itself SIGKILL once it has committed ``k`` output shards (over all the
    tasks it ran).
``exit_once(marker)``
    the first task (over all processes) that has committed an output shard creates ``marker``
    and ends its process with ``os._exit(70)`` before writing its task manifest; later attempts
    find ``marker`` and carry on.

Installed in the process that runs the tasks:

* this process: ``install(kill_after(7))`` (``install()`` removes them);
* a subprocess running the reshard command line, with tests/ and the repository root on
  ``PYTHONPATH``::

      python -m support.reshard_crash [--kill-after K] [--exit-once PATH] -- ARGS...

  is ``python -m streamrec.cli.reshard ARGS...`` with the hooks installed (:func:`main`);
* every worker process of a Dask cluster, the ones reshard starts itself and the ones Dask
  restarts included: this file (:data:`SCRIPT`) as a worker preload, set in the dask config
  before the cluster starts::

      {"distributed.worker.preload": [str(SCRIPT)],
       "distributed.worker.preload-argv": ["--exit-once", PATH]}

  (Dask copies the file and imports it by path, so it imports nothing from the tests.)
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from streamrec.reshard import task
from streamrec.reshard.plan import TaskSpec

__all__ = ["SCRIPT", "dask_setup", "exit_once", "install", "kill_after", "main"]

Hook = Callable[[TaskSpec, int], None]

#: this file (the Dask worker preload)
SCRIPT = Path(__file__).resolve()


def kill_after(k: int) -> Hook:
    """SIGKILL this process once it has committed ``k`` output shards over all its tasks."""
    committed: dict[int, int] = {}  # task index -> output shards it has committed so far

    def hook(spec: TaskSpec, committed_in_task: int) -> None:
        committed[spec.index] = committed_in_task
        if sum(committed.values()) >= k:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def exit_once(marker: str | os.PathLike[str]) -> Hook:
    """The first task anywhere to commit a shard creates ``marker`` and exits its process (70)
    before its task manifest; once ``marker`` exists, tasks carry on."""
    path = os.fspath(marker)

    def hook(spec: TaskSpec, committed_in_task: int) -> None:
        if committed_in_task < 1:
            return
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        os._exit(70)

    return hook


def install(*hooks: Hook) -> None:
    """Set the seam in this process to run ``hooks`` in order (none: unset it)."""
    if not hooks:
        task.after_shard_committed = None
        return

    def run_all(spec: TaskSpec, committed_in_task: int) -> None:
        for hook in hooks:
            hook(spec, committed_in_task)

    task.after_shard_committed = run_all


def _hooks(kill: int | None, marker: str | None) -> list[Hook]:
    hooks = []
    if kill is not None:
        hooks.append(kill_after(kill))
    if marker is not None:
        hooks.append(exit_once(marker))
    return hooks


@click.command()
@click.option("--kill-after", "kill", type=int, default=None)
@click.option("--exit-once", "marker", type=str, default=None)
def dask_setup(worker: Any, kill: int | None, marker: str | None) -> None:
    """Dask worker preload: install the hooks in the worker's process."""
    install(*_hooks(kill, marker))


def main(argv: list[str] | None = None) -> None:
    """Run the reshard command line in this process with the hooks installed."""
    parser = argparse.ArgumentParser(prog="python -m support.reshard_crash")
    parser.add_argument("--kill-after", dest="kill", type=int, default=None)
    parser.add_argument("--exit-once", dest="marker", default=None)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    install(*_hooks(options.kill, options.marker))
    sys.argv = ["streamrec.cli.reshard", *args]
    runpy.run_module("streamrec.cli.reshard", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
