"""The manifest of a shard set: one JSON object beside the shards, written last.

A writer that produces a set of shards (its template has an ``{index}`` field) writes, after
the last shard is committed, a manifest named ``_manifest.json`` by default in the shards'
directory. Because it is written last, its presence means the set is complete; a failed or
cancelled writer leaves no manifest.

Schema (version 1)::

    {
      "format": "streamrec.manifest.core",  // constant; "streamrec.manifest" read too
      "version": 1,                         // readers refuse a version they do not know
      "writer": "streamrec 0.1.0",
      "compression": null,                  // null | "gzip" | "zlib" (every shard alike)
      "template": "train-{index:05d}-of-{num_shards:05d}.tfrecord",   // as given
      "num_shards": 16,                     // = len(shards)
      "records": 1000000,                   // sum over the shards
      "bytes": 123456789,                   // sum over the shards
      "shards": [                           // by index, 0 .. num_shards-1
        {
          "index": 0,
          "name": "train-00000-of-00016.tfrecord",   // relative to the manifest's directory
          "url": "s3://bucket/data/train-00000-of-00016.tfrecord",   // as written
          "records": 62500,                 // TFRecord records in the shard
          "bytes": 7716049,                 // size of the object as stored (compressed)
          "crc32c": 2309112387,             // CRC-32C (Castagnoli, unmasked, as an unsigned
                                            // 32-bit integer) of the object's stored bytes
          "version": "\"9b2cf535f27731c974343645a3985328\"",  // ETag / generation, or null
          "record_index": {                 // optional: the record index sidecar
            "name": "train-00000-of-00016.tfrecord.idx",   // relative, as "name"
            "bytes": 1190012                // size of the index object
          }
        }
      ]
    }

``name`` is the shard's path relative to the manifest's directory: beside or below it, never
with ``..``. :func:`read_manifest` resolves names against the manifest's own location, so a
copied or moved directory (shards plus manifest) still reads correctly; ``url`` is informational.

A manifest is untrusted input: by default a name that is an absolute url or path, or that
climbs out with ``..``, is a :class:`~streamrec.errors.FormatError` (a manifest in a bucket
must not make the reader open local files, send GETs to other hosts or read other buckets with
the caller's credentials). ``allow_absolute_urls=True`` accepts absolute names anywhere: it
trusts whoever wrote the manifest. Absolute names inside the manifest's own directory (older
writers wrote them for some sets) are read as the relative names they are. Writers only write
relative names (:func:`dumps` refuses a shard outside the manifest's directory).

``version`` (optional) is the object's ETag (S3) or generation (GCS) as committed; readers
check every shard's size, and version where both have one, before reading it (see
:mod:`streamrec.manifest.check`).

``record_index`` (optional; written by ``open_writer(..., index=True)``; not ``index``, which
is the shard's position) names the shard's record index sidecar (``<shard name>.idx``, see
:mod:`streamrec.format.index.core`) and its size, so a reader can fetch it without looking it up.
Its name follows the same rules as shard names (relative, checked when read). A shard without
it has no index as far as the manifest knows. Readers that predate it ignore it (unknown keys
are ignored, so the version stays 1); this reader accepts manifests with and without it.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from streamrec.errors import FormatError, StorageError
from streamrec.pipeline.arguments import check_url
from streamrec.redact import redact
from streamrec.storage import timing
from streamrec.storage.base import ObjectInfo, split_scheme
from streamrec.storage.cache.store import ShardCache, cache_namespace, is_cacheable
from streamrec.storage.cache.whole import fetch_whole
from streamrec.storage.registry import ObjectStore, open_store
from streamrec.storage.retry import RetryPolicy

logger = logging.getLogger("streamrec")

__all__ = [
    "MANIFEST_NAME",
    "RECORD_INDEX",
    "is_manifest_url",
    "FORMAT",
    "READ_FORMATS",
    "VERSION",
    "Manifest",
    "ManifestEntry",
    "dumps",
    "loads",
    "read_manifest",
    "relative_name",
    "resolve_name",
]

MANIFEST_NAME = "_manifest.json"
"""The name writers give their manifest beside the shards (and directories are read by)."""

FORMAT = "streamrec.manifest.core"
"""The ``"format"`` marker this version writes. A frozen literal, never derived from a module
name: a persisted marker changes only with :data:`VERSION`, and the readers of every marker
ever written stay (:data:`READ_FORMATS`)."""
READ_FORMATS = ("streamrec.manifest.core", "streamrec.manifest")
"""Every ``"format"`` marker streamrec has written, all read: ``"streamrec.manifest"`` by the
writers of 2026-11-21 to 2026-11-23 (before the package refactor renamed the module, and the
marker with it, by accident), ``"streamrec.manifest.core"`` since; the documents are alike.
tests/data/compat/ holds manifests of both."""
VERSION = 1
RECORD_INDEX = "record_index"
"""A shard's key for its record index sidecar (``{"name": ..., "bytes": ...}``)."""


@dataclass(frozen=True)
class ManifestEntry:
    """One shard: its url, index in the set, record count, stored size and CRC32C, and the
    version (ETag, generation) it was committed as (None where the store has none); and its
    record index sidecar's url and size when it has one (``index_url``, ``index_bytes``)."""

    url: str
    records: int
    bytes: int
    crc32c: int
    index: int = 0
    version: str | None = None
    index_url: str | None = None
    index_bytes: int | None = None


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest: the shards (by index) and what describes them all."""

    shards: list[ManifestEntry]
    compression: str | None = None
    template: str | None = None
    version: int = VERSION

    @property
    def records(self) -> int:
        return sum(entry.records for entry in self.shards)

    @property
    def bytes(self) -> int:
        return sum(entry.bytes for entry in self.shards)


def _directory(url: str) -> str:
    """The directory part of ``url`` (``s3://b/d/x`` -> ``s3://b/d``)."""
    if "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://{posixpath.dirname(rest)}"
    return posixpath.dirname(url)


_SCHEME_ALIASES = {"s3a": "s3", "gcs": "gs", "https": "http", "file": ""}


def _canonical(url: str) -> str:
    """A spelling of ``url`` for comparisons (scheme aliases, absolute local paths)."""
    scheme, rest = split_scheme(url)
    scheme = _SCHEME_ALIASES.get(scheme, scheme)
    return f"{scheme}://{rest}" if scheme else os.path.abspath(rest)


def _is_absolute(name: str) -> bool:
    return "://" in name or name.startswith("/")


def relative_name(shard_url: str, manifest_url: str) -> str | None:
    """The name a shard is listed under: its path relative to the manifest's directory; None
    when the shard is not beside or below the manifest."""
    directory = _canonical(_directory(manifest_url)).rstrip("/") + "/"
    url = _canonical(shard_url)
    if not url.startswith(directory):
        return None
    name = url[len(directory) :]
    return name if _bad_name(name) is None else None


_MOST_DECODES = 3  # a name still percent-encoded after this many rounds is refused


def _decoded(text: str) -> str | None:
    """``text`` with percent-encoding undone until nothing changes (an http client or server
    decodes once, a proxy or a store maybe again); None when it is still encoded after
    :data:`_MOST_DECODES` rounds."""
    for _ in range(_MOST_DECODES + 1):
        decoded = unquote(text)
        if decoded == text:
            return text
        text = decoded
    return None


def _bad_name(name: str) -> str | None:
    """What is wrong with a relative shard name, or None. The name is checked as written and
    as the store may read it (percent-decoded, maybe more than once): ``%2e%2e/`` is ``../``
    to an http client."""
    if not name:
        return "it is empty"
    decoded = _decoded(name)
    if decoded is None:
        return f"it is still percent-encoded after {_MOST_DECODES} decodings"
    for form in dict.fromkeys((name, decoded)):
        if _is_absolute(form):
            return "it is absolute" if form is name else "it is absolute once percent-decoded"
        if "\\" in form:
            return "it has a backslash (a path separator to some servers)"
        if ".." in form.split("/"):
            return "it climbs out of the manifest's directory (..)"
        if any(ord(c) < 0x20 or c == "\x7f" for c in form):
            return "it has control characters"
    return None


def _path_inside(url: str, directory: str) -> bool:
    """True when ``url``, percent-decoded and normalised as a store or server would, is below
    ``directory`` (same scheme, host and bucket): the last check of a resolved name."""
    scheme, rest = split_scheme(url)
    home_scheme, home_rest = split_scheme(directory)
    if _SCHEME_ALIASES.get(scheme, scheme) != _SCHEME_ALIASES.get(home_scheme, home_scheme):
        return False
    path, home = _decoded(rest), _decoded(home_rest)
    if path is None or home is None:
        return False
    path = posixpath.normpath(path)
    home = posixpath.normpath(home) if home else ""
    if home in ("", "."):  # a manifest in the working directory: anything not above it
        return not (path == ".." or path.startswith(("../", "/")))
    return path.startswith(home.rstrip("/") + "/")


# A name of plain segments (letters, digits, ``_-.``, none starting with ``.``): nothing to
# decode, no ``.``/``..`` segment, not absolute: inside its directory as written. Such names
# (every writer's) skip the general checks, which cost ~25 us each: 2.5 s of a 100k-shard
# manifest's parse.
_PLAIN_NAME = re.compile(r"(?:[A-Za-z0-9_\-][A-Za-z0-9_.\-]*/)*[A-Za-z0-9_\-][A-Za-z0-9_.\-]*\Z")


def resolve_name(name: str, manifest_url: str, *, allow_absolute_urls: bool = False) -> str:
    """The url of a shard listed as ``name`` in the manifest at ``manifest_url``.

    Raises ValueError for a name outside the manifest's directory (absolute, or with ``..``)
    unless ``allow_absolute_urls`` (then absolute names are taken as they are).
    """
    prefix = _plain_prefix(_directory(manifest_url))
    if prefix is not None and _PLAIN_NAME.match(name):
        return prefix + name
    return _resolve_checked(name, manifest_url, allow_absolute_urls)


def _plain_prefix(directory: str) -> str | None:
    """What a plain name is appended to in ``directory``: exactly where the full checks put
    it; None where they would not take it as it is (a scheme's root, a directory still
    percent-encoded after decoding: the checks decide every name there)."""
    prefix = f"{directory.rstrip('/')}/" if directory else ""
    return prefix if _path_inside(f"{prefix}x", directory) else None


def _resolve_checked(name: str, manifest_url: str, allow_absolute_urls: bool) -> str:
    """:func:`resolve_name` for any name: every check."""
    if _is_absolute(name):
        inside = relative_name(name, manifest_url)
        if inside is None:
            if allow_absolute_urls:
                return name
            raise ValueError(
                f"{name!r} is an absolute url outside the manifest's directory; names must be "
                "relative to it (pass allow_absolute_urls=True to trust this manifest)"
            )
        name = inside
    problem = _bad_name(name)
    if problem is not None:
        raise ValueError(f"{name!r} is not a name relative to the manifest: {problem}")
    directory = _directory(manifest_url)
    url = f"{directory.rstrip('/')}/{name}" if directory else name
    if not _path_inside(url, directory):  # (not reached by a name _bad_name passes)
        raise ValueError(f"{name!r} resolves to {url}, outside the manifest's directory")
    return url


def dumps(manifest: Manifest, manifest_url: str, *, allow_absolute_urls: bool = False) -> bytes:
    """The JSON text of ``manifest`` (names relative to ``manifest_url``).

    Raises ValueError for a shard outside the manifest's directory, which readers would refuse;
    ``allow_absolute_urls`` lists such shards by their url instead (for streamrec's own
    scratch manifests, read back with the same flag).
    """
    from streamrec._version import __version__

    def name_of(url: str) -> str:
        name = relative_name(url, manifest_url)
        if name is not None:
            return name
        if allow_absolute_urls:
            return url
        raise ValueError(
            f"{url}: the shard is not beside or below its manifest {manifest_url}; "
            "readers only follow names relative to the manifest's directory"
        )

    def item(entry: ManifestEntry) -> dict[str, Any]:
        shard: dict[str, Any] = {
            "index": entry.index,
            "name": name_of(entry.url),
            "url": entry.url,
            "records": entry.records,
            "bytes": entry.bytes,
            "crc32c": entry.crc32c,
            "version": entry.version,
        }
        if entry.index_url is not None:
            shard[RECORD_INDEX] = {"name": name_of(entry.index_url), "bytes": entry.index_bytes}
        return shard

    document: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "writer": f"streamrec {__version__}",
        "compression": manifest.compression,
        "template": manifest.template,
        "num_shards": len(manifest.shards),
        "records": manifest.records,
        "bytes": manifest.bytes,
        "shards": [item(entry) for entry in manifest.shards],
    }
    return (json.dumps(document, indent=1) + "\n").encode("utf-8")


def loads(
    data: bytes | str,
    manifest_url: str,
    *,
    allow_absolute_urls: bool = False,
    directory: str | None = None,
) -> Manifest:
    """Parse and check a manifest; shard names are resolved against ``manifest_url``'s
    directory, or ``directory`` where given ("": the working directory; for a reshard's task
    manifests, which list shards by url as the job spelled them), see :func:`resolve_name`
    for ``allow_absolute_urls``."""

    def bad(problem: str) -> FormatError:
        return FormatError(f"not a valid streamrec manifest: {problem}", url=manifest_url)

    names_at = manifest_url  # a url whose directory the names are relative to
    if directory is not None:
        names_at = f"{directory.rstrip('/')}/{MANIFEST_NAME}" if directory else MANIFEST_NAME

    try:
        document = json.loads(data)
    except ValueError as exc:
        raise bad(f"not JSON ({exc})") from exc
    if not isinstance(document, dict) or document.get("format") not in READ_FORMATS:
        raise bad('"format" is not ' + " or ".join(f'"{marker}"' for marker in READ_FORMATS))
    version = document.get("version")
    if not isinstance(version, int) or version < 1:
        raise bad('"version" is missing')
    if version > VERSION:
        raise bad(f"version {version} is newer than this streamrec reads ({VERSION})")
    shards = document.get("shards")
    if not isinstance(shards, list):
        raise bad('"shards" is not a list')
    entries: list[ManifestEntry] = []
    base = _directory(names_at)
    prefix = _plain_prefix(base)
    home = _canonical(base).rstrip("/")

    def plain(name: str) -> bool:
        return prefix is not None and _PLAIN_NAME.match(name) is not None

    def resolve(name: str) -> str:  # resolve_name, its directory found once
        if prefix is not None and _PLAIN_NAME.match(name):
            return prefix + name
        return _resolve_checked(name, names_at, allow_absolute_urls)

    def same_place(written: str, url: str, name: str) -> bool:
        # _canonical of a plain name's url is home/name: no path normalised per shard
        canonical = f"{home}/{name}" if plain(name) else _canonical(url)
        return written in (url, canonical) or _canonical(written) == canonical

    for position, item in enumerate(shards):
        try:
            name, shard_version = item["name"], item.get("version")
            if not isinstance(name, str):
                raise TypeError(f"name {name!r} is not a string")
            if shard_version is not None and not isinstance(shard_version, str):
                raise TypeError(f"version {shard_version!r} is not a string")
            url = resolve(name)
            written = item.get("url")
            if not isinstance(written, str) or not same_place(written, url, name):
                shard_version = None  # moved or copied since: its versions are of elsewhere
            index_url, index_bytes = _record_index(item.get(RECORD_INDEX), resolve)
            entries.append(
                ManifestEntry(
                    url=url,
                    records=_count(item["records"]),
                    bytes=_count(item["bytes"]),
                    crc32c=_count(item["crc32c"]),
                    index=_count(item.get("index", position)),
                    version=shard_version,
                    index_url=index_url,
                    index_bytes=index_bytes,
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise bad(f"shard {position}: {exc}") from exc
    if [entry.index for entry in entries] != list(range(len(entries))):
        raise bad("shard indexes are not 0, 1, 2, ...")
    totals = {
        "records": sum(e.records for e in entries),
        "bytes": sum(e.bytes for e in entries),
        "num_shards": len(entries),
    }
    for key, total in totals.items():
        if key in document and document[key] != total:
            raise bad(f'"{key}" ({document[key]!r}) does not match the shards ({total})')
    compression = document.get("compression")
    if compression is not None and not isinstance(compression, str):
        raise bad(f'"compression" {compression!r} is not null or a string')
    template = document.get("template")
    return Manifest(
        shards=entries,
        compression=compression,
        template=template if isinstance(template, str) else None,
        version=version,
    )


def _record_index(value: object, resolve: Callable[[str], str]) -> tuple[str | None, int | None]:
    """A shard's ``record_index`` item: the sidecar's url (its name checked like a shard's)
    and size; (None, None) when there is none."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise TypeError(f"{RECORD_INDEX} {value!r} is not an object")
    name = value.get("name")
    if not isinstance(name, str):
        raise TypeError(f"{RECORD_INDEX} name {name!r} is not a string")
    return resolve(name), _count(value.get("bytes"))


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


async def read_manifest(
    url: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    *,
    retry: RetryPolicy | None = None,
    allow_absolute_urls: bool = False,
) -> list[ManifestEntry]:
    """The shards listed by the manifest at ``url``, by index (async).

    Raises :class:`~streamrec.errors.ObjectNotFoundError` when there is no manifest (the set
    is incomplete, or was never written) and :class:`~streamrec.errors.FormatError` when the
    object is not a manifest this version understands, or lists a shard outside its own
    directory (unless ``allow_absolute_urls``: see the module docstring). ``url`` may be a
    ``str`` or an ``os.PathLike`` (``pathlib.Path``).
    """
    url = check_url(url, "url")
    manifest = await load_manifest(
        url, storage_options, retry=retry, allow_absolute_urls=allow_absolute_urls
    )
    return manifest.shards


async def load_manifest(
    url: str,
    storage_options: dict[str, Any] | None = None,
    *,
    retry: RetryPolicy | None = None,
    store: ObjectStore | None = None,
    allow_absolute_urls: bool = False,
    cache: ShardCache | None = None,
) -> Manifest:
    """The whole parsed manifest at ``url`` (see :func:`read_manifest`); ``store`` is an open
    store for ``url``'s scheme to use (and leave open) instead of a new one.

    ``cache``: the host's cache of the dataset's metadata. A remote manifest larger than
    what its lookup read is fetched through it (:mod:`streamrec.storage.cache.whole`):
    downloaded once per host, keyed by its url and version, so the host's other consumers
    (DataLoader workers, DDP ranks, resumed runs) read that copy. A copy is checked as the
    object is; one that fails is removed and the manifest fetched again."""
    policy = retry or RetryPolicy()
    owned = store is None
    store = store or open_store(url, storage_options)
    try:
        # (a lookup of one object is a request too: often a first-bytes GET holding it whole)
        [info] = await timing.metadata_read(
            policy.run(lambda: store.expand(url), describe=f"{url}: listing")
        )
        # (the whole object in what the lookup read: nothing more to fetch, nothing to keep)
        held = store.read_range_cached(info, 0, info.size)
        if held is not None:
            data = b"".join(held)
        elif cache is not None and is_cacheable(url):
            return await _through_cache(
                info,
                store,
                cache,
                cache_namespace(url, storage_options),
                policy,
                allow_absolute_urls,
            )
        else:
            data = await timing.metadata_read(
                policy.run(lambda: store.read_range(info, 0, info.size), describe=f"{url}: reading")
            )
        if len(data) != info.size:
            raise StorageError(f"{url}: read {len(data)} of {info.size} bytes of the manifest")
    finally:
        if owned:
            await store.close()
    return loads(data, url, allow_absolute_urls=allow_absolute_urls)


async def _through_cache(
    info: ObjectInfo,
    store: ObjectStore,
    cache: ShardCache,
    namespace: str,
    retry: RetryPolicy,
    allow_absolute_urls: bool,
) -> Manifest:
    """The manifest ``info`` read from the host's copy (see :func:`load_manifest`)."""
    copy = await fetch_whole(info, store, cache, namespace, retry, keep_bytes=True)
    try:
        return loads(copy.read(), info.url, allow_absolute_urls=allow_absolute_urls)
    except FormatError as exc:
        if not copy.hit:  # the object's own bytes (just fetched): its error
            raise
        logger.warning(
            "the cached copy %s of %s is not a valid manifest (%s): removed, fetched again",
            copy.path,
            redact(info.url),
            exc,
        )
        copy.discard()
    copy = await fetch_whole(info, store, cache, namespace, retry, keep_bytes=True)
    return loads(copy.read(), info.url, allow_absolute_urls=allow_absolute_urls)


def is_manifest_url(url: str) -> bool:
    """True for urls that name a manifest (``*.json``) rather than TFRecord shards."""
    return url.rstrip("/").lower().endswith(".json")


def manifest_for(
    entries: Sequence[ManifestEntry], *, compression: str | None, template: str | None
) -> Manifest:
    """A manifest of ``entries`` (sorted by index)."""
    return Manifest(
        shards=sorted(entries, key=lambda e: e.index), compression=compression, template=template
    )
