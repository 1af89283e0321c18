"""The door's TLS context, built once per process and ``verify`` setting, ahead of need.

Loading a CA bundle costs ~20-40 ms of CPU. The context is built in a worker thread (the
bundle is parsed mostly without the GIL) while the first request waits for its connection
(:func:`start_tls_context`), or earlier still: :func:`prewarm`, called by ``open_dataset`` for
``s3://`` urls, starts it in a warm-up thread (:mod:`streamrec.storage.warmup`) between
``open_dataset`` and the first ``next()``. An ``ssl.SSLContext`` is made to be shared by
connections and threads; a changed CA bundle file is seen by the next process. A forked child
forgets a context its parent was still building (the thread building it is not in the child).

Trust as botocore's: ``verify=False`` checks nothing; a path is the CA bundle; True is
botocore's own bundle (``botocore.httpsession.get_cert_path``: certifi's where installed).

A client certificate (botocore's ``client_cert``) makes a context of the store's own
(:func:`build_tls_context` with ``client_cert``), never shared: a certificate renewed on disk
is offered by the next store.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from concurrent.futures import Future
from typing import Any

from streamrec.storage import warmup

__all__ = ["ClientCert", "build_tls_context", "prewarm", "start_tls_context"]

ClientCert = str | tuple[str, str]
"""botocore's ``client_cert``: a PEM file holding the certificate and its key, or the paths
of the certificate and of its key."""

_lock = threading.Lock()
_tls_contexts: dict[bool | str, Future[ssl.SSLContext]] = {}


def build_tls_context(verify: bool | str, client_cert: ClientCert | None = None) -> ssl.SSLContext:
    """A client TLS context that trusts what botocore's would for ``verify`` and offers
    ``client_cert`` (as urllib3 does, whatever ``verify`` says). A key protected by a
    passphrase is refused (ValueError), not prompted for on the terminal as OpenSSL would."""
    context = _trusting(verify)
    if client_cert is not None:
        cert, key = (client_cert, None) if isinstance(client_cert, str) else client_cert
        context.load_cert_chain(cert, key, password=_no_passphrase)
    return context


def _no_passphrase() -> str:
    raise ValueError("its key is protected by a passphrase, which streamrec does not ask for")


def _trusting(verify: bool | str) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    from botocore.httpsession import get_cert_path

    cafile = get_cert_path(verify)
    if isinstance(cafile, str) and os.path.isdir(cafile):
        return ssl.create_default_context(capath=cafile)
    return ssl.create_default_context(cafile=cafile if isinstance(cafile, str) else None)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for key, future in list(_tls_contexts.items()):
        if not future.done():
            del _tls_contexts[key]


os.register_at_fork(after_in_child=_after_fork_in_child)


def _claim(verify: bool | str) -> tuple[Future[ssl.SSLContext], bool]:
    """The future of ``verify``'s context, and whether the caller must build it."""
    with _lock:
        future = _tls_contexts.get(verify)
        if future is not None:
            return future, False
        future = _tls_contexts[verify] = Future()
        future.set_running_or_notify_cancel()  # a waiter's cancel never cancels the build
        return future, True


def _build(verify: bool | str, future: Future[ssl.SSLContext]) -> None:
    """Build ``verify``'s context into ``future`` (a failure is forgotten, not kept: the
    next store tries again, and this one's requests raise it)."""
    try:
        context = build_tls_context(verify)
    except BaseException as exc:
        _build_failed(verify, future, exc)
        if not isinstance(exc, Exception):
            raise
    else:
        future.set_result(context)


def start_tls_context(verify: bool | str) -> asyncio.Future[ssl.SSLContext]:
    """``verify``'s context for the running loop: the process's one, built now in a worker
    thread if nobody has started it."""
    future, mine = _claim(verify)
    if mine:
        try:
            asyncio.get_running_loop().run_in_executor(None, _build, verify, future)
        except BaseException as exc:  # (no executor): nobody may wait for it
            _build_failed(verify, future, exc)
            raise
    return asyncio.wrap_future(future)


def _build_failed(verify: bool | str, future: Future[ssl.SSLContext], exc: BaseException) -> None:
    with _lock:
        if _tls_contexts.get(verify) is future:
            del _tls_contexts[verify]
    if not future.done():
        future.set_exception(exc)


def prewarm(storage_options: dict[str, Any] | None) -> None:
    """Import what an S3 store needs, and start building the TLS context its door will use,
    in a warm-up thread. Any error is left to the normal path."""
    try:
        import s3fs
        from fsspec.config import apply_config

        from streamrec.storage.s3.settings import door_settings

        settings = door_settings(
            apply_config(s3fs.S3FileSystem, dict(storage_options or {})), os.environ
        )
    except Exception:  # the store raises it, as it would without a warm-up
        return
    if settings is None or not settings.tls:
        return
    verify = settings.verify
    future, mine = _claim(verify)
    if mine:
        try:
            warmup.start("s3-tls", lambda: _build(verify, future))
        except BaseException as exc:
            _build_failed(verify, future, exc)
            raise
