"""What every benchmark's report says around its table: the command, the date, the machine, the
source measured; and the README sections the scripts rewrite between their marks."""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import REPO_ROOT

__all__ = [
    "command_line",
    "cpu_model",
    "given_outputs",
    "now",
    "publish",
    "replace_section",
    "source_state",
]


def replace_section(path: Path, start_mark: str, end_mark: str, section: str, intro: str) -> None:
    """Put ``section`` between the two marks of ``path``, replacing what was there.

    A file without the marks gets ``intro`` and the marked section appended (a missing file
    is created with them).
    """
    text = path.read_text() if path.exists() else ""
    if start_mark not in text or end_mark not in text:
        text = text.rstrip("\n") + ("\n\n" if text else "") + intro + f"{start_mark}\n{end_mark}\n"
    head, rest = text.split(start_mark, 1)
    _, tail = rest.split(end_mark, 1)
    path.write_text(f"{head}{start_mark}\n{section}\n{end_mark}{tail}")


def publish(section: str, out: Path | None, write: Callable[[Path, str], None]) -> None:
    """Print ``section``; with ``out``, also ``write(out, section)`` (into its README section)."""
    print()
    print(section)
    if out is not None:
        write(out, section)
        print(f"\nwrote {out}")


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """``python benchmarks/<script> <arguments>`` as run (``argv`` None: ``sys.argv[1:]``)."""
    return (
        "python benchmarks/" + script + " " + " ".join(sys.argv[1:] if argv is None else argv)
    ).strip()


def given_outputs(args: Any) -> str:
    """`` --out X --json Y`` as given to a script that rebuilds its command line (else "")."""
    out = f" --out {args.out}" if getattr(args, "out", None) else ""
    return out + (f" --json {args.json}" if getattr(args, "json", None) else "")


def now() -> str:
    """The local date and time, with its zone, as the reports show it."""
    return dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")


def cpu_model(fallback: str) -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else ``fallback``."""
    cpu = fallback
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return cpu


def source_state() -> str:
    """The commit measured, and which files under ``streamrec/`` differ from it (if any)."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
            )
        except (OSError, subprocess.CalledProcessError):
            return ""
        return done.stdout.rstrip("\n")  # not strip(): porcelain lines start with a space

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = [line[3:] for line in git("status", "--porcelain", "streamrec").splitlines()]
    if not changed:
        return f"commit {commit}, clean"
    return f"commit {commit} + uncommitted changes in {', '.join(changed)}"
