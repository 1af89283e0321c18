"""The async writer used as if it were blocking: said at once, never a silent empty output.

``streamrec.open_writer`` is async: ``w.write(payload)`` makes a coroutine that writes only
when awaited. Called from plain code, or left un-awaited inside a coroutine, it used to write
nothing and only warn ("coroutine was never awaited") when garbage-collected. Here: a plain
``with``, or ``write`` / ``write_many`` / ``close`` called outside a running event loop, raise
a TypeError at once; a write never awaited makes ``close()`` fail (and abort the writer)
instead of committing shards that lack its records.
"""

from __future__ import annotations

import asyncio

__all__ = ["ASYNC_WRITER", "check_in_loop", "unawaited"]

ASYNC_WRITER = (
    "use `async with streamrec.open_writer(...) as w: await w.write(payload)` in async code, "
    "or `with streamrec.sync.open_writer(...) as w: w.write(payload)` in plain code"
)


def check_in_loop(method: str) -> None:
    """TypeError unless an event loop runs in this thread (the coroutine could be awaited)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise TypeError(
            f"ShardWriter.{method}() called outside an event loop: streamrec.open_writer is "
            f"async and its {method}() writes nothing unless awaited; {ASYNC_WRITER}"
        ) from None


def unawaited(calls: int) -> TypeError:
    """The error of ``close()`` when ``calls`` write calls were never awaited."""
    return TypeError(
        f"{calls} write()/write_many() call(s) of this writer were never awaited: their records "
        "were not written, so the writer is aborted (no manifest; shards not yet committed "
        "are dropped); "
        f"await every call: {ASYNC_WRITER}"
    )
