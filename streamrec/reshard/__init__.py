"""Resharding: rewrite a set of TFRecord shards as another, store to store, resumable.

:func:`reshard` (in :mod:`.job`) is the entry point; :mod:`.plan` cuts the job into tasks
(sans-I/O), :mod:`.task` runs one, :mod:`.state` keeps what a rerun needs, :mod:`.dask` runs
the tasks on a Dask cluster.
"""

from streamrec.reshard.job import ReshardProgress, ReshardSummary, reshard

__all__ = ["ReshardProgress", "ReshardSummary", "reshard"]
