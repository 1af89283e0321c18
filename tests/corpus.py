"""Where the TensorFlow-written reference corpus lives, and its manifest (loaded once)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def find_corpus() -> Path:
    """shared/corpus beside the repository (or $STREAMREC_CORPUS)."""
    env = os.environ.get("STREAMREC_CORPUS")
    candidates = [Path(env)] if env else []
    candidates += [parent / "shared" / "corpus" for parent in Path(__file__).resolve().parents]
    for candidate in candidates:
        if (candidate / "manifest.json").is_file():
            return candidate
    raise RuntimeError(
        "the reference corpus (shared/corpus/manifest.json) was not found beside the "
        "repository; set STREAMREC_CORPUS to its directory"
    )


CORPUS_DIR = find_corpus()
with open(CORPUS_DIR / "manifest.json") as _f:
    MANIFEST: dict[str, Any] = json.load(_f)
