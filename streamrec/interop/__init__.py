"""streamrec from the tools users already have: each module is an optional extra, imported
only when a user imports it (``import streamrec`` never loads these libraries).

* :mod:`~streamrec.interop.grain`: grain (JAX) data sources: random access over indexed
  shards (``TFRecordDataSource``) and a checkpointable ``IterDataset`` over any streamrec
  dataset (``TFRecordIterDataset``). ``pip install "streamrec[grain]"``.
* :mod:`~streamrec.interop.prometheus`: a dataset's ``stats`` as Prometheus metrics, read on
  each scrape (``to_prometheus``). ``pip install "streamrec[prometheus]"``.
* :mod:`~streamrec.interop.ray`: Ray Data: ``read_tfrecords`` (a datasource: read tasks by
  shard groups or record ranges, Arrow blocks) and ``TFRecordDatasink`` /
  ``write_tfrecords`` (shards through streamrec's writer, one manifest).
  ``pip install "streamrec[ray]"``.

Arrow output lives with the Example decoder (``ds.parse(spec).to_arrow()``,
:mod:`streamrec.format.example.arrow`); the PyTorch adapter is :mod:`streamrec.torch`.
"""
