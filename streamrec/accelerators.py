"""Whether the optional C accelerators are in use (``streamrec --version`` says; a pure-Python
fallback is logged once, at INFO, by the first ``open_dataset``)."""

from __future__ import annotations

import logging
import sys

from streamrec.format.accel import PURE_PYTHON_VARIABLE, load_accelerator, pure_python_requested

__all__ = ["describe", "log_fallback_once", "status"]

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
