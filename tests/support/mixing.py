"""The mix of three local sources that integration/test_mix.py reads, in the test process and
in fresh processes (which import only this, not torch)."""

from __future__ import annotations

from typing import Any

import streamrec

__all__ = ["mixed"]


def mixed(files: list[list[str]], stop: str, **options: Any) -> streamrec.MixedDataset:
    """Sources with different settings: a shuffle buffer, shuffled shards, neither."""
    datasets = [
        streamrec.open_dataset(files[0], shuffle_buffer=8, seed=1, **options),
        streamrec.open_dataset(files[1], shuffle_shards=True, **options),
        streamrec.open_dataset(files[2], **options),
    ]
    return streamrec.mix(datasets, [0.6, 0.3, 0.1], seed=2, stop=stop)  # type: ignore[arg-type]
