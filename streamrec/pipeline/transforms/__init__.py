"""The transforms of a dataset (``parse``, ``batch``, ``map``, ``filter``, ``take``, ``skip``,
``repeat``, ``unbatch``) and the protocol that chains them.

* ``chain.py``: :class:`~streamrec.pipeline.transforms.chain.Source`, the protocol of every link;
* ``chainable.py``: :class:`~streamrec.pipeline.transforms.chainable.Chainable` (the methods)
  and the public dataset classes each one returns;
* ``stage.py``: the :class:`~streamrec.pipeline.transforms.stage.Stage` every transform shares;
* ``ledger.py``: items handed out -> records of the source consumed (exact resume);
* ``ops.py`` / ``pieces.py``: each transform's Stage, and its chunk algorithm;
* ``mapper.py``: ``map``'s worker threads or processes; ``repeat.py``: ``.repeat(epochs)``.

Rules: a transform reads its source only through the ``Source`` protocol and works a chunk at a
time; consumption is counted only through the ledger, so every state is exact.
"""
