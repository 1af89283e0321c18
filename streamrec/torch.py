"""PyTorch adapter: a streamrec dataset as a ``torch.utils.data.IterableDataset``.

::

    import streamrec, streamrec.torch
    from torch.utils.data import DataLoader

    ds = streamrec.open_dataset("s3://bucket/train-*.tfrecord", cycle_length=8)
    loader = DataLoader(streamrec.torch.IterableDataset(ds.parse(spec).batch(256)),
                        batch_size=None, num_workers=4)
    for epoch in range(epochs):
        loader.dataset.set_epoch(epoch)
        for batch in loader: ...            # dict of tensors, leading dimension 256

What each process reads:

* **DataLoader workers** (``num_workers`` > 0, ``fork``, ``forkserver`` or ``spawn``): each
  worker reads a disjoint share, every record once across workers: the dataset splits its
  shards by ``torch.utils.data.get_worker_info()`` when it plans an iteration (by record when
  there are fewer shards than workers). Each worker has its own event loop and connections.
* **DDP**: when ``torch.distributed`` is initialised and the dataset was not given
  ``num_hosts``/``host_index`` (they are still 1 and 0), each rank reads the share
  ``host_index=rank`` of ``num_hosts=world_size`` (``split_by_rank=None``, the default; the
  wrapper sets these two attributes on the dataset). ``split_by_rank=True`` always splits by
  rank (an error if ``torch.distributed`` is not initialised when iteration starts),
  ``False`` never. The rank is looked up when the wrapper is built, pickled (spawned workers)
  or iterated, whichever first finds the process group initialised. Ranks get whole shards,
  so their record counts differ unless the shards are equal; stop every rank after the same
  number of steps (DDP needs it).

A ``streamrec.mix`` of datasets is split the same way: each of its sources by worker and
rank, and each worker mixes its shares (same seed, same draws).

Items are whatever the wrapped dataset yields: ``bytes`` (a ``Dataset`` or a mix), dicts of
numpy arrays (``ds.parse(spec)``; the DataLoader's ``batch_size`` then stacks them into
tensors), whole batches (``ds.parse(spec).batch(n)``, with ``DataLoader(batch_size=None)``;
numpy arrays become tensors, ``VarLenFeature`` lists stay lists), or what any chain of
transforms makes (``.map``, ``.filter``, ``.take``, ...: each worker runs the chain on its own
share, so ``take(n)`` takes ``n`` per worker).

``set_epoch``, ``stats``, ``state_dict`` and ``load_state_dict`` are forwarded to the wrapped
dataset. Exact resume is supported with ``num_workers=0``: the state then describes what the
loader has taken from the dataset (which, with ``num_workers=0``, is what it handed out:
the default loader reads no further ahead than the batch it builds). With ``num_workers`` > 0
every worker iterates its own copy of the dataset, so the object in the main process does not
know the workers' positions: use torchdata's ``StatefulDataLoader``, which calls
``state_dict()`` inside each worker after every batch it hands out and ``load_state_dict()``
in each worker on resume; ``loader.state_dict()`` then resumes every worker exactly (tested
with 2 workers and a shuffle buffer). ``set_epoch`` must be called before the
loader starts an epoch's workers (not with ``persistent_workers=True``, which keeps the
first epoch's copies).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

try:
    import torch
    import torch.distributed
    import torch.utils.data
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("streamrec.torch needs PyTorch: pip install torch") from error

from streamrec.pipeline.stats import Stats
from streamrec.pipeline.transforms.chain import Source
from streamrec.pipeline.transforms.stage import root_of

__all__ = ["IterableDataset", "worker_states"]


class IterableDataset(torch.utils.data.IterableDataset[Any]):
    """A streamrec dataset (raw, parsed or batched) for ``torch.utils.data.DataLoader``.

    See the module documentation for worker and DDP splitting and what resume supports.
    Picklable when the wrapped dataset is (for ``spawn`` workers).
    """

    def __init__(self, source: Source[Any], *, split_by_rank: bool | None = None) -> None:
        if not isinstance(source, Source):
            raise TypeError(
                "IterableDataset wraps a streamrec dataset (open_dataset(), a mix, or any "
                f"transform of them: parse, batch, map, filter, ...), not {type(source).__name__}"
            )
        self.source = source
        """The wrapped streamrec dataset."""
        self.split_by_rank = split_by_rank
        self._rank_applied = False
        self._apply_rank()

    @property
    def dataset(self) -> Any:
        """The root of the wrapped chain: the :class:`~streamrec.Dataset` (or the mix) that
        reads the shards and splits them."""
        return root_of(self.source)

    def _apply_rank(self, starting: bool = False) -> None:
        """Split by DDP rank if asked (or by default) and the process group is up."""
        if self.split_by_rank is False or self._rank_applied:
            return
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            if starting and self.split_by_rank:
                raise RuntimeError(
                    "split_by_rank=True, but torch.distributed is not initialised "
                    "(call torch.distributed.init_process_group first)"
                )
            return
        self._rank_applied = True
        dataset = self.dataset
        if not hasattr(dataset, "split_hosts"):
            return
        if self.split_by_rank is None and (dataset.num_hosts, dataset.host_index) != (1, 0):
            return  # the user split by hand
        dataset.split_hosts(dist.get_world_size(), dist.get_rank())

    def __iter__(self) -> Iterator[Any]:
        self._apply_rank(starting=True)
        return iter(self.source)

    def __len__(self) -> int:
        """``len()`` of the wrapped dataset for this process (its rank's share under DDP; in
        the main process, what all DataLoader workers yield together): what
        ``len(DataLoader(...))`` is made from. A TypeError where record counts are unknown
        (see ``streamrec.Dataset.__len__``)."""
        self._apply_rank()
        return len(self.source)

    def __getstate__(self) -> dict[str, Any]:
        # pickled for spawned workers, which have no process group: resolve the rank here
        self._apply_rank()
        return self.__dict__.copy()

    @property
    def stats(self) -> Stats:
        """The wrapped dataset's counters (of this process)."""
        return self.source.stats

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (shard and record shuffling depend on ``(seed, epoch)``)."""
        self.source.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped dataset's position (exact with ``num_workers=0``; see the module doc)."""
        state: dict[str, Any] = self.source.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` on the next iteration."""
        self.source.load_state_dict(state)

    def __repr__(self) -> str:
        return f"streamrec.torch.IterableDataset({self.source!r})"


def worker_states(loader_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dataset states in a torchdata ``StatefulDataLoader``'s ``state_dict()``: one per
    worker (its ``dataset_state``), or the one of a loader without workers.

    For elastic resume of indexed reading (``shuffle="global"``/``"block"``, ``even``): gather
    these from every rank, merge them with :func:`streamrec.merge_states` and load the merged
    state into the dataset before building the new loader (whose worker count may differ:
    the loader itself refuses another ``num_workers``).
    """
    snapshot = loader_state.get("_snapshot")
    if isinstance(snapshot, Mapping):
        workers = snapshot.get("_worker_snapshots")
        if isinstance(workers, Mapping):
            ordered = sorted(workers.values(), key=lambda w: int(w.get("worker_id", 0)))
            return [w["dataset_state"] for w in ordered if w.get("dataset_state") is not None]
    state = loader_state.get("dataset_state")
    if isinstance(state, dict):
        return [state]
    raise ValueError(
        "not a StatefulDataLoader state with dataset states (is the dataset a "
        "streamrec.torch.IterableDataset?)"
    )
