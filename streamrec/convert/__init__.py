"""Converting TFRecord Examples to and from other formats, store to store.

:mod:`.sample` takes a sample spread over a whole dataset (the spec inferred from it:
:mod:`streamrec.format.example.infer`); :mod:`.parquet` writes Examples as Parquet files and
reads Parquet rows back as Examples (``streamrec convert``).
"""
