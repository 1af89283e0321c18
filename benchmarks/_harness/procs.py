"""Child processes, peak RSS and round order: how the benchmarks measure one read at a time.

A measurement that must own its process (its peak RSS, its imports, a fresh S3 client) runs the
benchmark script again with a hidden flag (``--worker``, ``--child``); the child prints its
result as one ``RESULT <json>`` line (:func:`print_result`) and the parent reads it back
(:func:`run_script`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "print_result",
    "reset_peak_rss",
    "rotated",
    "run_child",
    "run_script",
    "status_kib",
]

RESULT = "RESULT "
T = TypeVar("T")


def status_kib(key: str) -> int | None:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``); None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak_rss() -> int | None:
    """Reset the peak-RSS mark (Linux); return the current RSS in KiB, None if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return status_kib("VmRSS")


def print_result(result: dict[str, Any]) -> int:
    """The child's side: its result as the ``RESULT`` line the parent looks for."""
    print(RESULT + json.dumps(result), flush=True)
    return 0


def run_child(
    args: Sequence[str], timeout: float, what: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``args`` to the end (``env``: added to this process's environment); return the
    result of its last ``RESULT`` line."""
    done = subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else {**os.environ, **env},
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT):
            result: dict[str, Any] = json.loads(line[len(RESULT) :])
            return result
    raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def run_script(
    script: str | Path,
    flag: str,
    payload: str,
    timeout: float,
    what: str,
    prefix: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``[*prefix] python <script> <flag> <payload>`` in a fresh interpreter (``env`` added
    to its environment): its result."""
    args = [*prefix, sys.executable, str(Path(script).resolve()), flag, payload]
    return run_child(args, timeout, what, env)


def rotated(items: Sequence[T], round_: int) -> list[T]:
    """``items`` starting at ``round_ % len(items)``: who goes first changes every round."""
    k = round_ % len(items)
    return [*items[k:], *items[:k]]
