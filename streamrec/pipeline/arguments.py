"""Checks of the arguments users pass to ``open_dataset``, ``open_writer`` and their kin.

Every public entry point checks its arguments up front, naming the argument: a ``1.5`` given
as ``shuffle_buffer`` fails at ``open_dataset``, not as ``non-integer arg 1 for randrange()``
deep inside the first iteration. Paths may be ``str`` or any ``os.PathLike`` (``pathlib``).
A bad argument is an :class:`~streamrec.errors.ArgumentError` (both a ``ValueError`` and a
``TypeError``: code catching either keeps working).
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from streamrec.errors import ArgumentError

#: What ``open_dataset`` reads: a path or url, or a list of them (``str`` or ``os.PathLike``).
PathOrUrls = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

__all__ = [
    "PathOrUrls",
    "check_bool",
    "check_choice",
    "check_int",
    "check_optional_int",
    "check_optional_ratio",
    "check_url",
    "check_urls",
]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def check_url(value: object, name: str = "url") -> str:
    """A path or url argument as ``str``: a ``str`` or an ``os.PathLike`` (``pathlib.Path``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise ArgumentError(
        f"{name} must be a str or os.PathLike path or url, not {type(value).__name__} "
        f"({_shown(value)})"
    )


def check_urls(value: object, name: str = "urls") -> list[str]:
    """One path or url, or any iterable of them (read in its order), as a list of ``str``."""
    if isinstance(value, (str, os.PathLike)):
        return [check_url(value, name)]
    if isinstance(value, (bytes, bytearray, memoryview)) or not isinstance(value, Iterable):
        raise ArgumentError(
            f"{name} must be a path or url (str or os.PathLike) or a list of them, not "
            f"{type(value).__name__} ({_shown(value)})"
        )
    return [check_url(item, f"{name}[{i}]") for i, item in enumerate(value)]


def check_int(value: object, name: str, *, minimum: int | None = None) -> int:
    """An integer argument (numpy integers too; never a bool or a float) ``>= minimum``."""
    if isinstance(value, bool):
        raise ArgumentError(f"{name} must be an integer, not a bool ({value!r})")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ArgumentError(
            f"{name} must be an integer, not {type(value).__name__} ({_shown(value)})"
        ) from None
    if minimum is not None and number < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ArgumentError(f"{name} must be {what}, not {number}")
    return number


def check_optional_int(value: object, name: str, *, minimum: int | None = None) -> int | None:
    """:func:`check_int`, or None."""
    return None if value is None else check_int(value, name, minimum=minimum)


def check_optional_ratio(value: object, name: str, *, minimum: float) -> float | None:
    """A finite real number ``>= minimum`` (ints and numpy numbers too, never a bool), stored
    as ``float``; or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(
            f"{name} must be a number >= {minimum:g} or None, not {type(value).__name__} "
            f"({_shown(value)})"
        )
    number = float(value)
    if not math.isfinite(number) or number < minimum:
        raise ArgumentError(f"{name} must be a number >= {minimum:g} or None, not {value!r}")
    return number


def check_bool(value: object, name: str) -> bool:
    """A flag: ``True`` or ``False`` (numpy's bools too), nothing else."""
    if isinstance(value, bool):
        return value
    if type(value).__name__ == "bool_":  # numpy.bool_, without importing numpy here
        return bool(value)
    raise ArgumentError(f"{name} must be True or False, not {_shown(value)}")


def check_choice(value: Any, name: str, choices: Collection[Any]) -> Any:
    """One of ``choices`` (compared with ``==`` and by type: ``True`` is not ``1``)."""
    for choice in choices:
        if type(value) is type(choice) and value == choice:
            return value
    allowed = ", ".join(repr(c) for c in choices)
    raise ArgumentError(f"{name} must be one of {allowed}, not {_shown(value)}")
