"""The transforms of a dataset (``parse``, ``batch``, ``map``, ``filter``, ``take``, ``skip``,
``repeat``, ``unbatch``) and the protocol that chains them.

* ``chain.py``: :class:`~streamrec.pipeline.transforms.chain.Source`, the protocol of every link;
* ``chainable.py``: :class:`~streamrec.pipeline.transforms.chainable.Chainable` (the methods)
  and the public dataset classes each one returns;
* ``stage.py``: the :class:`~streamrec.pipeline.transforms.stage.Stage` every transform shares;
* ``ledger.py``: the one consumed-records ledger (``Consumption``: pieces handed on -> how far
  the consumer got) that ``Dataset``, every transform and ``MixedDataset`` keep, each with its
  own account of a piece (the cursor moved, ``Ledger``'s source records, each source marked);
* one module per op, each with its Stage (arguments, length, counters) and its chunk
  algorithm: ``batch.py`` (parse, batch, unbatch), ``map.py`` (inline or on worker threads or
  processes), ``filter.py``, ``slice.py`` (take, skip), ``repeat.py``.

Rules: a transform reads its source only through the ``Source`` protocol and works a chunk at a
time; consumption is counted only through the ledger, so every state is exact. Op modules
import the shared machinery (stage, ledger), never ``chainable.py``, and no other op but
``repeat`` (``slice``'s skip); ``chainable.py`` imports them all: a public class is an op's Stage
plus ``Chainable``, whose methods make them, so it lives there to keep imports one way.
"""
