"""Which optional C accelerators this process uses.

``streamrec.format._cframing`` (the frame scanner) and ``_cexample`` (the Example batch
parser) are built by ``pip install`` when a C compiler is there. Without them streamrec runs
on pure-Python twins with identical results. ``STREAMREC_PURE_PYTHON=1`` in the environment
when streamrec is imported selects the pure-Python paths in an install that has the
accelerators (the tests run the whole suite both ways); at build time it skips building them.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["PURE_PYTHON_VARIABLE", "load_accelerator", "pure_python_requested"]

PURE_PYTHON_VARIABLE = "STREAMREC_PURE_PYTHON"


def pure_python_requested() -> bool:
    """Whether the environment asks for the pure-Python paths (any value but ``""``/``0``)."""
    return os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0")


def load_accelerator(name: str) -> ModuleType | None:
    """The C extension ``streamrec.format.<name>``, or None if not built or not wanted."""
    if pure_python_requested():
        return None
    try:
        return importlib.import_module(f"streamrec.format.{name}")
    except ImportError:  # not built: no compiler at install time
        return None
