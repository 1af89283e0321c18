"""``streamrec.mix``: records drawn from several datasets by weight, deterministic, resumable.

* ``mixed.py``: :class:`~streamrec.pipeline.mix.mixed.MixedDataset` and ``mix()``;
* ``order.py``: which source each draw takes from (counter-based, stratified, numpy chunks);
* ``state.py``: the mix's resume state, checked on load.

Rules: a mix reads its datasets only through the ``Source`` protocol (transforms/), so any
chain can be a source, and it is one itself; the draws depend on ``(seed, epoch)`` alone.
"""
