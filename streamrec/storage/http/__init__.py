"""HTTP: streamrec's own range transport, shared by the stores, and ``http(s)://`` urls.

* ``range_get.py``: HTTP/1.1 range GETs on pooled keep-alive connections whose bodies land
  straight in the pieces handed on (C ``_cread``, or Python); Content-Length, to-EOF and
  chunked bodies, each bounded by what was asked;
* ``chunked.py``: a chunked body decoded as it arrives, within stated bounds;
* ``body.py``: checks of an answer's body and ``Content-Range`` against what was asked; the
  ``response_class`` that caps what the clients' sessions (S3's, Azure's) read whole;
* ``store.py``: ``http(s)://`` objects (listing through fsspec's HTTPFileSystem).

Rules: everything a server sends is checked before it is followed; a redirect is never
followed for a signed request; a body longer than asked for is an error before it is kept.
"""
