"""Which optional C accelerators this process uses (``streamrec --version`` says; a
pure-Python fallback is logged once, at INFO, by the first ``open_dataset``).

``streamrec.format._cframing`` (the frame scanner) and ``_cexample`` (the Example batch
parser) are built by ``pip install`` when a C compiler is there. Without them streamrec runs
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
    """``{"framing": ..., "example": ..., "hardware_crc": ...}``: which C code is in use.

    ``framing`` is the record scanner (CRC checks), ``example`` the batch Example decoder,
    ``hardware_crc`` whether the scanner's CRC32C uses the CPU's instructions.
    """
    framing = load_accelerator("_cframing")
    # the extension alone: streamrec.format.example would load protobuf
    example = load_accelerator("_cexample") is not None and sys.byteorder == "little"
    hardware = framing is not None and bool(framing.has_hardware_crc())
    return {"framing": framing is not None, "example": example, "hardware_crc": hardware}


def describe() -> str:
    """One line: ``"C accelerators: framing (hardware CRC32C), Example decoding"``, or what
    runs in pure Python."""
    found = status()
    used = []
    if found["framing"]:
        used.append("framing" + (" (hardware CRC32C)" if found["hardware_crc"] else ""))
    if found["example"]:
        used.append("Example decoding")
    missing = [name for name in ("framing", "example") if not found[name]]
    if not missing:
        return "C accelerators: " + ", ".join(used)
    fallback = ", ".join("Example decoding" if m == "example" else m for m in missing)
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
    if not (found["framing"] and found["example"]):
        logger.info(
            "streamrec runs without some C accelerators (%s); reinstall with a C compiler "
            "for full speed",
            describe(),
        )
