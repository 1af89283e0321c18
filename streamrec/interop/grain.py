"""grain (JAX) over TFRecord shards in any store streamrec reads, every CRC checked.

::

    import grain
    from streamrec.interop.grain import TFRecordDataSource

    source = TFRecordDataSource("s3://bucket/train/", spec=spec)   # indexed shards
    loader = grain.DataLoader(
        data_source=source,
        sampler=grain.samplers.IndexSampler(len(source), shuffle=True, seed=0, num_epochs=1),
        operations=[grain.transforms.Batch(256)],
        worker_count=8,
    )

* :class:`TFRecordDataSource` is grain's ``RandomAccessDataSource``: ``len()`` is every
  record of the shards listed, ``source[i]`` the ``i``-th (``Dataset.get``: the dataset
  index or sidecars locate it, one range read brings it), ``source.__getitems__(keys)`` and
  grain's batched ``_getitems`` read many in one call (neighbours share range reads). It
  pickles into grain's worker processes (each opens its own connections) and is safe to call
  from grain's reader threads. Shards need an index (``streamrec index URL``).
* :class:`TFRecordIterDataset` is a ``grain.IterDataset`` over any streamrec dataset or
  chain (shards without an index, shuffles, transforms): its iterator's ``get_state()`` is
  the dataset's ``state_dict()``, so grain's checkpointing resumes it exactly.

With ``spec``, records are decoded as :func:`streamrec.example.decode` does (a dict of numpy
arrays per record); without, they are ``bytes``.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, SupportsIndex

try:
    import grain
except ImportError as error:  # pragma: no cover - the extra is installed in the tests
    raise ImportError(
        "streamrec.interop.grain needs grain: pip install 'streamrec[grain]'"
    ) from error

from streamrec.format.example import FeatureSpec, decode, decode_batch
from streamrec.pipeline.dataset import Dataset, open_dataset
from streamrec.pipeline.transforms.batch import split_batch
from streamrec.pipeline.transforms.stage import root_of
from streamrec.redact import redact

__all__ = ["TFRecordDataSource", "TFRecordIterDataset"]


class TFRecordDataSource:
    """grain's random-access data source over indexed TFRecord shards (see the module).

    ``urls`` and ``options`` are :func:`streamrec.open_dataset`'s (``storage_options``,
    ``cache_dir``, ``max_concurrency``, ...). ``spec`` decodes each record into a dict of
    numpy arrays.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        spec: Mapping[str, FeatureSpec] | None = None,
        **options: Any,
    ) -> None:
        self.dataset: Dataset = open_dataset(urls, **options)
        """The streamrec dataset the records come from."""
        self.spec = None if spec is None else dict(spec)
        if self.spec is not None:
            decode_batch([], self.spec)  # a bad spec fails here, not in a worker

    def __len__(self) -> int:
        return self.dataset.num_records

    def __getitem__(self, record_key: SupportsIndex) -> Any:
        (record,) = self.dataset.get([record_key.__index__()])
        return record if self.spec is None else decode(record, self.spec)

    def __getitems__(self, record_keys: Iterable[SupportsIndex]) -> list[Any]:
        """The records at ``record_keys``, in one call (a DataLoader's or grain's batch)."""
        records = self.dataset.get([key.__index__() for key in record_keys])
        if self.spec is None:
            return records
        return split_batch(decode_batch(records, self.spec), len(records))

    _getitems = __getitems__  # grain's batched-read protocol names it so

    def __repr__(self) -> str:  # grain's DataLoader keeps it in its checkpoints
        urls = [redact(url) for url in self.dataset.urls]
        what = "bytes" if self.spec is None else f"spec={sorted(self.spec)}"
        return f"TFRecordDataSource({urls!r}, {what})"

    def close(self) -> None:
        """End the reads' loop thread and connections (also done at garbage collection)."""
        self.dataset.close()


class TFRecordIterDataset(grain.IterDataset):  # type: ignore[misc]
    """A ``grain.IterDataset`` over a streamrec dataset, a mix or any chain of transforms.

    Each ``iter()`` is one pass over its own copy of ``source`` (as it is when ``iter`` is
    called), so two iterators never share a position; the iterator's state is that copy's
    exact ``state_dict()`` (JSON), so grain's (and Orbax's) checkpoints resume it exactly.
    grain's ``mp_prefetch`` workers each read their own share (:meth:`set_slice`). grain's
    prefetching asks for the state after every element it reads ahead: with a shuffle
    buffer that is a large state, so put ``.batch()`` before any prefetch."""

    def __init__(self, source: Any) -> None:
        super().__init__()
        self.source = source
        """The streamrec dataset iterated (copied by each ``iter()``)."""

    def __iter__(self) -> _StreamIterator:
        return _StreamIterator(pickle.loads(pickle.dumps(self.source)))

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Read only share ``sl.start`` of ``sl.step`` (grain's ``mp_prefetch`` worker
        split): the shards are split again as ``num_hosts`` splits them, for every dataset
        at the root of the chain (each source of a mix). ``sequential_slice`` is not
        supported: shares are interleaved, as ``num_hosts`` makes them."""
        if sequential_slice:
            raise ValueError("TFRecordIterDataset splits shards interleaved, not sequentially")
        start, step = sl.start or 0, sl.step or 1
        root = root_of(self.source)
        for dataset in getattr(root, "datasets", [root]):  # a mix: each of its sources
            hosts, index = dataset.num_hosts, dataset.host_index
            dataset.split_hosts(hosts * step, index + hosts * start)

    def __str__(self) -> str:
        return f"TFRecordIterDataset({self.source!r})"


class _StreamIterator(grain.DatasetIterator):  # type: ignore[misc]
    def __init__(self, source: Any) -> None:
        super().__init__()
        self._source = source
        self._records: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self._records is None:
            self._records = iter(self._source)
        return next(self._records)

    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = self._source.state_dict()
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        self._end()
        self._source.load_state_dict(state)

    def _end(self) -> None:
        records, self._records = self._records, None
        close = getattr(records, "close", None)
        if close is not None:
            close()

    def close(self) -> None:
        self._end()
        super().close()
