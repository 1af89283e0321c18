"""Whether the optional C accelerators are in use (``streamrec --version`` says; a pure-Python
fallback is logged once, at INFO, by the first ``open_dataset``)."""

from __future__ import annotations

import importlib
import logging
import sys

__all__ = ["describe", "log_fallback_once", "status"]

logger = logging.getLogger("streamrec")
_logged = False


def status() -> dict[str, bool]:
    """``{"framing": ..., "example": ..., "hardware_crc": ...}``: which C code is in use.

    ``framing`` is the record scanner (CRC checks), ``example`` the batch Example decoder,
    ``hardware_crc`` whether the scanner's CRC32C uses the CPU's instructions.
    """
    from streamrec.format import framing

    try:  # the extension alone: streamrec.format.example would load protobuf
        importlib.import_module("streamrec.format._cexample")
        example = sys.byteorder == "little"
    except ImportError:  # pragma: no cover - depends on the build
        example = False
    hardware = False
    if framing.accelerated:
        from streamrec.format import _cframing  # type: ignore[attr-defined]

        hardware = bool(_cframing.has_hardware_crc())
    return {"framing": framing.accelerated, "example": example, "hardware_crc": hardware}


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
        + f"; pure Python (slower) for {fallback}: the extensions were not built"
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
