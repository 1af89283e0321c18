"""``s3://``: every read through one door, the aiobotocore client for writes.

* ``store.py``: :class:`~streamrec.storage.s3.store.S3Store`: listing (paged globs), first
  bytes, range reads, sinks and open uploads; chooses the door or the client once, at set-up;
* ``settings.py``: whether the door serves a store's options and environment, and how
  (endpoint and addressing, signing region, credentials, request parameters as headers);
* ``door.py``: :class:`~streamrec.storage.s3.door.S3Door`: range GETs, listing pages and first
  bytes signed here on streamrec's own connections; a bucket's region learnt once;
* ``credentials.py``: the options' credentials, or botocore's resolver's (refreshed by it);
* ``sigv4.py``: SigV4 headers of a GET (sans-I/O); ``listing.py``: a listing page parsed
  within bounds; ``params.py``: the caller's request parameters per client operation;
* ``session.py``: the client's requests on the store's own session, following no redirect
  (botocore's public ``before-send`` event); ``tls.py``: the door's TLS context, built once;
* ``sink.py``: multipart uploads (nothing visible until the upload completes).

Rules: no private attribute of botocore, aiobotocore or s3fs is read; a request is sent once
(streamrec's retry policy above decides); no redirect is followed (credentials would go along).
"""
