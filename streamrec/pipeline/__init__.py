"""The read pipeline: shards -> byte streams -> records -> the consumer.

At the root: ``dataset.py`` (``open_dataset``, :class:`~streamrec.pipeline.dataset.Dataset`),
``options.py`` (every read setting, checked once), ``arguments.py`` (argument checks shared
with the writer), ``budget.py`` (the prefetch byte budget), ``stats.py`` (the counters) and
``order.py`` (an indexed epoch's order, sans-I/O). The wings, each described in its own
``__init__``: ``listing/`` (what the urls stand for, the shard plan, record counts),
``position/`` (the consumer's exact position and resume state), ``stream/`` (the streaming
engine), ``indexed/`` (the indexed engine and random access), ``transforms/`` (``parse``,
``batch``, ``map`` ... and the chain protocol), ``mix/`` (``streamrec.mix``).

Imports point down this list: listing <- position <- stream <- indexed <- dataset <- mix, with
transforms beside them (below dataset and mix); the root's options, budget, stats and order are
below every wing. No wing imports one above it, and none needs its ``__init__`` to re-export.
"""
