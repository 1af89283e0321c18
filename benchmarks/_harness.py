"""What the benchmark scripts share (imported as ``_harness`` from beside them)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["replace_section"]


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
