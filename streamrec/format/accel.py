"""Which optional C accelerators this process uses (``streamrec --version`` says; a
pure-Python fallback is logged once, at INFO, by the first ``open_dataset``).

``streamrec.format._cframing`` (the frame scanner), ``_cexample`` (the Example batch
parser) and ``streamrec.storage._cread`` (large local records read straight into their
``bytes``; it does I/O, so it lives in storage/) are built by ``pip install`` when a C
compiler is there. Without them streamrec runs
on pure-Python twins with identical results. ``STREAMREC_PURE_PYTHON=1`` in the environment
when streamrec is imported selects the pure-Python paths in an install that has the
accelerators (the tests run the whole suite both ways); at build time it skips building them.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from types import ModuleType

__all__ = [
    "PURE_PYTHON_VARIABLE",
    "describe",
    "load_accelerator",
    "log_fallback_once",
    "pure_python_requested",
    "status",
]

PURE_PYTHON_VARIABLE = "STREAMREC_PURE_PYTHON"


def pure_python_requested() -> bool:
    """Whether the environment asks for the pure-Python paths (any value but ``""``/``0``)."""
    return os.environ.get(PURE_PYTHON_VARIABLE, "") not in ("", "0")


def load_accelerator(name: str, package: str = "streamrec.format") -> ModuleType | None:
    """The C extension ``<package>.<name>``, or None if not built or not wanted."""
    if pure_python_requested():
        return None
    try:
        return importlib.import_module(f"{package}.{name}")
    except ImportError:  # not built: no compiler at install time
        return None


logger = logging.getLogger("streamrec")
_logged = False


def status() -> dict[str, bool]:
    """``{"framing": ..., "example": ..., "local_reads": ..., "hardware_crc": ...}``: which C
    code is in use.

    ``framing`` is the record scanner (CRC checks), ``example`` the batch Example decoder,
    ``local_reads`` the reads of large local records straight into their ``bytes``
    (``streamrec.storage._cread``), ``hardware_crc`` whether the scanner's CRC32C uses the
    CPU's instructions.
    """
    framing = load_accelerator("_cframing")
    # the extension alone: streamrec.format.example would load protobuf
    example = load_accelerator("_cexample") is not None and sys.byteorder == "little"
    local_reads = load_accelerator("_cread", "streamrec.storage") is not None
    hardware = framing is not None and bool(framing.has_hardware_crc())
    return {
        "framing": framing is not None,
        "example": example,
        "local_reads": local_reads,
        "hardware_crc": hardware,
    }


_LABELS = {
    "framing": "framing",
    "example": "Example decoding",
    "local_reads": "large local records",
}


def describe() -> str:
    """One line: ``"C accelerators: framing (hardware CRC32C), Example decoding, large local
    records"``, or what runs in pure Python."""
    found = status()
    used = []
    if found["framing"]:
        used.append("framing" + (" (hardware CRC32C)" if found["hardware_crc"] else ""))
    used += [_LABELS[name] for name in ("example", "local_reads") if found[name]]
    missing = [name for name in _LABELS if not found[name]]
    if not missing:
        return "C accelerators: " + ", ".join(used)
    fallback = ", ".join(_LABELS[name] for name in missing)
    return (
        "C accelerators: "
        + (", ".join(used) or "none")
        + f"; pure Python (slower) for {fallback}: "
        + (
            f"{PURE_PYTHON_VARIABLE} is set"
            if pure_python_requested()
            else "the extensions were not built"
        )
    )


def log_fallback_once() -> None:
    """Log at INFO, once per process, when some C accelerator is not in use."""
    global _logged
    if _logged:
        return
    _logged = True
    found = status()
    if not all(found[name] for name in _LABELS):
        logger.info(
            "streamrec runs without some C accelerators (%s); reinstall with a C compiler "
            "for full speed",
            describe(),
        )
