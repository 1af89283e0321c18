"""The TensorFlow-written reference corpus the project carries (tests/data/corpus), and its
manifest (loaded once).

The files were written by real TensorFlow (``generate.py`` beside them rebuilds them); the
manifest describes every byte and what TensorFlow does on each damaged file. Nothing here reads
from outside the repository.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS_DIR = Path(__file__).resolve().parents[1] / "data" / "corpus"

with open(CORPUS_DIR / "manifest.json") as _f:
    MANIFEST: dict[str, Any] = json.load(_f)
