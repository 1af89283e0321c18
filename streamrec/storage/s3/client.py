"""The aiobotocore S3 client's set-up: what makes a client quick to create, and the start-up
work (:mod:`streamrec.storage.warmup`) done ahead for it.

* botocore's data loader (the parsed service model, endpoint rules and partitions, ~50-100 ms
  of JSON per client) is shared by every client of the process (:func:`share_loader`), so the
  second and later iterations (epochs, DataLoader workers forked after a first read) create
  theirs quickly. It parses into plain dicts (ordered since Python 3.7; botocore's
  ``OrderedDict`` hook makes the 1.2 MB endpoints file ~3x slower to parse), and checks that
  ``s3`` exists by looking at its own directory, not by listing all ~400 services' (botocore
  does, per model type): a fresh process (a spawned DataLoader worker, a Dask task) creates its
  first client in about half the time (~45 ms instead of ~90 ms here).
* the TLS context (loading the CA bundle, ~20-40 ms of CPU that aiobotocore spends before the
  first request) is built once per process and ``verify`` setting, in a worker thread (the
  bundle is parsed without holding the GIL) while the client is being created
  (:func:`start_tls_context`), and handed to every client that resolves the same ``verify``
  (:func:`use_tls_context`). An ``ssl.SSLContext`` is made to be shared by connections and
  threads; a changed CA bundle file is seen by the next process. A forked child forgets a
  context its parent was still building (the thread building it is not in the child).
* :func:`prewarm` (called by ``open_dataset`` for ``s3://`` urls) imports s3fs and aiobotocore
  in the caller, then parses the service model and builds the TLS context in two warm-up
  threads: by the first ``next()`` the client costs its own creation only (~15-20 ms).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, overload

from streamrec.storage import warmup
from streamrec.storage.s3.listing import EarlyListing, early_listing

__all__ = ["prewarm", "share_loader", "shared_loader", "start_tls_context", "use_tls_context"]

_lock = threading.Lock()
_shared_loader: Any = None  # botocore's data loader, shared by every client of the process
_models_loaded = False  # prewarm parsed what a client loads
_parked: list[Any] = []  # a session prewarm made for the next client without session options
_tls_contexts: dict[Any, Future[Any]] = {}  # ``verify`` -> its TLS context, once built


class _ServiceNames(Sequence[str]):
    """What botocore's ``Loader.list_available_services`` returns, computed only as far as it
    is asked: ``name in names`` looks into that service's directories alone (botocore's loader
    checks a service exists by listing all ~400 of them, ~15 ms per model type); anything
    else lists them all, as botocore would."""

    def __init__(self, loader: Any, type_name: str, list_all: Callable[[], list[str]]) -> None:
        self._loader, self._type_name, self._list_all = loader, type_name, list_all
        self._all: list[str] | None = None

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str) or os.sep in name or name.startswith("."):
            return False
        for location in self._loader._potential_locations():
            directory = os.path.join(location, name)
            if os.path.isdir(directory) and any(
                self._loader.file_loader.exists(os.path.join(directory, v, self._type_name))
                for v in os.listdir(directory)
            ):
                return True
        return False

    def _names(self) -> list[str]:
        if self._all is None:
            self._all = self._list_all()
        return self._all

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())


def _fast_loader(default: Any) -> Any:
    """A botocore data loader with ``default``'s search paths that parses JSON into plain
    dicts and checks that a service exists without listing every service."""
    import json

    import botocore.loaders

    class PlainJSONFileLoader(botocore.loaders.JSONFileLoader):  # type: ignore[misc]
        def _load_file(self, full_path: str, open_method: Any) -> Any:
            if not os.path.isfile(full_path):
                return None
            with open_method(full_path, "rb") as fp:
                return json.loads(fp.read().decode("utf-8"))

    class Loader(botocore.loaders.Loader):  # type: ignore[misc]
        def list_available_services(self, type_name: str) -> Sequence[str]:
            parent = super().list_available_services
            return _ServiceNames(self, type_name, lambda: parent(type_name))

    return Loader(
        extra_search_paths=list(default.search_paths),
        file_loader=PlainJSONFileLoader(),
        include_default_search_paths=False,
    )


def shared_loader(session: Any) -> Any:
    """The process-wide botocore data loader (created from ``session``'s search paths by the
    first caller)."""
    global _shared_loader
    with _lock:
        if _shared_loader is None:
            _shared_loader = _fast_loader(session.get_component("data_loader"))
        return _shared_loader


def share_loader(fs: Any) -> None:
    """Give ``fs`` a botocore session whose data loader is the process-wide one (unless the
    user passed a session of their own)."""
    if getattr(fs, "session", None) is not None:
        return
    try:
        import aiobotocore.session  # type: ignore[import-untyped]

        kwargs = getattr(fs, "kwargs", {})
        with _lock:
            session = _parked.pop() if _parked and not kwargs else None
        if session is None:
            session = aiobotocore.session.AioSession(**kwargs)
            session.register_component("data_loader", shared_loader(session))
    except Exception:  # an optimisation only: s3fs then makes its own session
        return
    fs.session = session
    if hasattr(fs, "_session_is_owned"):
        fs._session_is_owned = True


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads: a TLS context one of them was still
    building (a client's set-up in an executor thread, or a warm-up that outlasted the fork's
    wait) would never be finished there, and every client of the child would wait for it;
    a lock one of them held would stay held. The child forgets both."""
    global _lock
    _lock = threading.Lock()
    for key, future in list(_tls_contexts.items()):
        if not future.done():
            del _tls_contexts[key]


os.register_at_fork(after_in_child=_after_fork_in_child)


def _tls_key(verify: Any) -> Any:
    return verify if isinstance(verify, (str, bool)) else None


def _claim_tls(verify: Any) -> tuple[Future[Any], bool] | None:
    """The future of ``verify``'s TLS context, and whether the caller must build it (None:
    not cacheable)."""
    key = _tls_key(verify)
    if key is None:
        return None
    with _lock:
        future = _tls_contexts.get(key)
        if future is not None:
            return future, False
        future = _tls_contexts[key] = Future()
        future.set_running_or_notify_cancel()  # a waiter's cancel never cancels the build
        return future, True


def _build_tls(verify: Any, future: Future[Any]) -> None:
    """Build ``verify``'s TLS context into ``future`` (a failure is forgotten, not kept)."""
    try:
        from aiobotocore.httpsession import AIOHTTPSession  # type: ignore[import-untyped]

        context = AIOHTTPSession(verify=verify)._build_ssl_contexts(None)[0]
    except BaseException as exc:
        _abandon_tls(verify, future, exc)
        if not isinstance(exc, Exception):
            raise
    else:
        future.set_result(context)


def _abandon_tls(verify: Any, future: Future[Any], error: BaseException) -> None:
    """``future`` will not be built (its build failed, or could not start): forget it, and
    end it with ``error``, so that nobody waits for it (each client then builds its own)."""
    with _lock:
        if _tls_contexts.get(_tls_key(verify)) is future:
            del _tls_contexts[_tls_key(verify)]
    if not future.done():
        future.set_exception(error)


def _verify_of(client_kwargs: dict[str, Any] | None, session: Any) -> Any:
    """The ``verify`` aiobotocore will resolve for a client (as it does: the client's
    argument, the session's ``ca_bundle``, then ``REQUESTS_CA_BUNDLE``)."""
    verify = (client_kwargs or {}).get("verify")
    if verify is None and session is not None:
        verify = session.get_config_variable("ca_bundle")
    elif verify is None:  # (no session yet: its ca_bundle as read from the environment)
        verify = os.environ.get("AWS_CA_BUNDLE")
    if verify is None:
        verify = os.environ.get("REQUESTS_CA_BUNDLE", True)
    return verify


def start_tls_context(fs: Any) -> tuple[Any, asyncio.Future[Any]] | None:
    """The TLS context aiobotocore will want for the client ``fs`` is about to create: the
    process's one for its ``verify`` (built now in a worker thread if nobody has):
    ``(verify, future)``, or None when it cannot tell or there is nothing slow to build."""
    try:
        verify = _verify_of(fs.client_kwargs, fs.session)
        if not verify:
            return None  # nothing slow to build
        claimed = _claim_tls(verify)
        if claimed is None:
            return None
        future, mine = claimed
        if mine:
            try:
                asyncio.get_running_loop().run_in_executor(None, _build_tls, verify, future)
            except BaseException as exc:  # (no executor): nobody may wait for it
                _abandon_tls(verify, future, exc)
                raise
    except Exception:  # an optimisation only
        return None
    return verify, asyncio.wrap_future(future)


async def use_tls_context(client: Any, verify: Any, future: asyncio.Future[Any]) -> None:
    """Hand the context of :func:`start_tls_context` to the client's HTTP session, if the
    client resolved the same ``verify`` and needs nothing else (client certificate)."""
    try:
        context = await future
        http = client._endpoint.http_session
        original = http._build_ssl_contexts
        if http._verify != verify or getattr(http, "_cert_file", None):
            return
    except Exception:  # an optimisation only: aiobotocore builds its own
        return

    def prebuilt(proxy_url: str | None) -> tuple[Any, Any]:
        if proxy_url is None:
            return context, None
        return original(proxy_url)  # type: ignore[no-any-return]

    http._build_ssl_contexts = prebuilt


def prewarm(storage_options: dict[str, Any] | None) -> None:
    """Start what the first S3 client of this process will need, in warm-up threads (see the
    module docstring). Import errors and the like are left to the normal path."""
    global _models_loaded
    options = storage_options or {}
    try:
        import aiobotocore.httpsession
        import aiobotocore.session
        import s3fs  # noqa: F401
    except Exception:  # the store raises it, as it would without a warm-up
        return
    if options.get("session") is not None:
        return  # the user's own session (and loader)
    direct = _direct_listing(options)
    if direct is not None and not direct.tls:
        return  # no client, no TLS: nothing to warm (storage/s3_direct.py)
    # as _verify_of resolves it, the session's ca_bundle read from the environment alone (a
    # config file's ca_bundle is then not warmed: the client builds its context as usual)
    verify = (options.get("client_kwargs") or {}).get("verify")
    if verify is None:
        verify = os.environ.get("AWS_CA_BUNDLE") or os.environ.get("REQUESTS_CA_BUNDLE", True)
    claimed = _claim_tls(verify) if verify else None
    tls = claimed[0] if claimed is not None and claimed[1] else None
    with _lock:  # (the direct requests need no models: those are the client's)
        load = not _models_loaded and direct is None
        _models_loaded = _models_loaded or load

    def job() -> None:
        # one thread started here (each start costs the caller a GIL hand-over); the TLS
        # context, parsed mostly without the GIL, in a thread of its own beside the models
        if tls is not None:
            try:
                warmup.start("s3-tls", lambda: _build_tls(verify, tls), settles=False)
            except BaseException as exc:  # (no thread): nobody may wait for it
                _abandon_tls(verify, tls, exc)
                raise
        if load:
            _load_models(aiobotocore.session.AioSession())

    if tls is not None or load:
        try:
            warmup.start("s3", job)
        except BaseException as exc:
            if tls is not None:
                _abandon_tls(verify, tls, exc)
            raise


def _direct_listing(options: dict[str, Any]) -> EarlyListing | None:
    """The settings of the requests a store of ``options`` sends without its client, as the
    store resolves them (fsspec's configured defaults with the caller's options); None: it
    makes the client."""
    try:
        import s3fs
        from fsspec.config import apply_config

        return early_listing(apply_config(s3fs.S3FileSystem, dict(options)), os.environ)
    except Exception:  # an optimisation only
        return None


def _load_models(session: Any) -> None:
    """Parse into the shared loader what creating an S3 client loads, and park ``session``
    (handlers registered, ~4 ms) for the first client whose options need no session
    arguments (a botocore session holds no loop, thread or connection)."""
    loader = shared_loader(session)
    for kind in ("service-2", "endpoint-rule-set-1"):
        loader.load_service_model("s3", kind)
    for name in ("endpoints", "partitions", "sdk-default-configuration"):
        loader.load_data(name)
    session.register_component("data_loader", loader)
    with _lock:
        _parked[:] = [session]
