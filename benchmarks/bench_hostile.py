"""Hostile input: peak memory and the error raised for adversarial files, with the defaults.

Run from the repository root after ``python setup.py build_ext --inplace``::

    python benchmarks/bench_hostile.py [--json PATH]

Each case is generated under a temporary directory (sparse or compressed: a few MiB on disk)
and read with ``for record in streamrec.open_dataset(url)`` (defaults: ``prefetch_bytes``
64 MiB, blocks of 4 MiB) in a fresh child process. ``RSS +MiB`` is the child's peak RSS
(``VmHWM``, reset through ``/proc/self/clear_refs`` after the imports) minus its RSS at that
moment, so the interpreter and the imported modules are not counted; ``vs prefetch`` divides it
by ``prefetch_bytes``. ``records`` is what the loop received before the error (or in all).

Cases:

* ``gzip bomb``: 2 GiB of zero-filled 1 MiB records in ~2 MiB of gzip (~1000:1), a valid
  shard: it must be read to its end without memory growing with the ratio.
* ``2^40-byte header``: a 512 MiB object (sparse) whose first record header claims 2^40 bytes.
* ``damaged gzip``: a gzip shard of 4,096 good 4 KiB records, then one whose payload CRC is
  wrong: every good record first, then the error.
* ``HTTP ignoring Range``: a 256 MiB shard behind Python's ``http.server`` (which answers every
  range GET with the whole object, status 200).
* ``HTTP 500 with a 256 MiB body`` (issue 29 B.13): every GET of the shard is answered 500 with
  a 256 MiB error body, sent as fast as the reader takes it: a few KiB of it is quoted, then
  the connection dropped (the retries' answers too).
* record index sidecars (``_harness/hostile_indexes.py``, issue 29 B.6, B.7, B.9), each read
  with the call and options its label says: a 103 MB space-padded sidecar of a 64 KiB gzip
  shard and a valid 2M-record shard's sidecar (``len(ds)``), a gzip bomb whose index claims
  one 512 MiB record (``ds.get([0])``, ``prefetch_bytes`` 1 MiB), and 100,000 empty records
  with 48 of 4 MiB (``even=True``, ``shuffle="block"``, ``prefetch_bytes`` 8 MiB; again
  with its table built before the measure: what the reading adds). ``vs prefetch`` divides
  by that case's ``prefetch_bytes``.

* ``S3 listing page``: a glob ``s3://bkt/d/*`` on an S3 endpoint whose every listing page is
  16 MiB of XML (as long as a page may be): 4 million empty elements (``flat``) or 2 million
  nested ones (``nested``), listed with the store's own requests and through its aiobotocore
  client (issue 29 B.14). It must be refused with memory bounded by the page, not by its
  element count.
* ``S3 listing page of 128 MiB, padded, through the client``: a page of 128 MiB of spaces,
  sent chunked (no length to refuse it by): refused once a page's most has arrived.
* ``Azure listing page``: ``az://c/d/*`` on an endpoint whose every answer is a 16 MiB page
  of empty or nested elements, or 128 MiB of padding sent chunked: refused before the SDK
  reads or parses it whole.
* ``empty``: a well-formed page of no key (the glob matches nothing): what setting up the
  client and listing cost (its modules imported, botocore's service model loaded), for the
  rows above to be read against.

``--only bomb,skewed-idx`` runs some cases (keys: bomb, header, damaged, http, error-body,
padded-idx, many-idx, bomb-idx, skewed-idx, skewed-idx-read, listing-flat, listing-nested,
listing-flat-client, listing-nested-client, listing-empty-client, listing-padded-client,
listing-empty-azure, listing-flat-azure, listing-nested-azure, listing-padded-azure).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _harness import MIB, hostile_indexes
from _harness.procs import print_result, reset_peak_rss, run_script, status_kib
from _harness.report import command_line, now, publish, replace_section
from _harness.results import JSON_HELP, save_results

START_MARK = "<!-- bench_hostile:start -->"
END_MARK = "<!-- bench_hostile:end -->"


def _masked_crc(data: bytes) -> int:
    from streamrec.format.crc import masked_crc32c

    return int(masked_crc32c(data))


def _header(length: int) -> bytes:
    packed = struct.pack("<Q", length)
    return packed + struct.pack("<I", _masked_crc(packed))


def make_bomb(directory: Path) -> str:
    """2 GiB of zero records in ~2 MiB of gzip."""
    from streamrec.format.shard import ShardEncoder

    path = directory / "bomb.tfrecord.gz"
    encoder = ShardEncoder("gzip", level=9)
    records = [bytes(MIB)] * 64
    with path.open("wb") as f:
        for _ in range(32):
            f.write(encoder.encode(records))
        f.write(encoder.finish())
    return str(path)


def make_huge_header(directory: Path) -> str:
    path = directory / "huge.tfrecord"
    with path.open("wb") as f:
        f.write(_header(1 << 40))
        f.truncate(512 * MIB)  # sparse
    return str(path)


def make_damaged_gzip(directory: Path) -> str:
    from streamrec.format.framing import RecordEncoder

    good = [bytes([i % 251]) * 4096 for i in range(4096)]
    data = bytearray(RecordEncoder().encode_many([*good, b"bad record", b"after"]))
    offset = sum(len(p) + 16 for p in good)
    data[offset + 12 + len(b"bad record")] ^= 0x40  # the damaged record's payload CRC
    path = directory / "damaged.tfrecord.gz"
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    path.write_bytes(compressor.compress(bytes(data)) + compressor.flush())
    return str(path)


def make_http_shard(directory: Path) -> str:
    import streamrec.sync

    served = directory / "http"
    served.mkdir()
    payload = os.urandom(100 << 10)
    with streamrec.sync.open_writer(str(served / "big.tfrecord"), compression=None) as w:
        for _ in range(256 * MIB // len(payload)):
            w.write(payload)
    return "big.tfrecord"


class _Quiet(SimpleHTTPRequestHandler):
    """The standard library's static file handler: it never answers 206. Under
    ``/error-body/`` it answers every GET 500 with a :data:`ERROR_BODY_BYTES` body."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if not self.path.startswith("/error-body/"):
            super().do_GET()
            return
        self.send_response(500)
        self.send_header("Content-Length", str(ERROR_BODY_BYTES))
        self.end_headers()
        chunk = b"x" * MIB
        try:
            for _ in range(ERROR_BODY_BYTES // MIB):
                self.wfile.write(chunk)
        except OSError:  # the reader hung up: what it should do
            pass


ERROR_BODY_BYTES = 256 * MIB


def make_error_body(directory: Path) -> str:
    return "error-body/shard.tfrecord"


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the reader hangs up mid-body on purpose (BrokenPipeError): not news


CASES: dict[str, tuple[str, Callable[[Path], str]]] = {
    "bomb": ("gzip bomb (2 GiB of zeros in ~2 MiB)", make_bomb),
    "header": ("2^40-byte header in a 512 MiB object", make_huge_header),
    "damaged": ("damaged gzip record after 4,096 good ones", make_damaged_gzip),
    "http": ("HTTP server ignoring Range (256 MiB object)", make_http_shard),
    "error-body": ("HTTP 500 with a 256 MiB body, every attempt", make_error_body),
}


PAGE_BYTES = 16 << 20  # an S3 listing page as long as a page may be
PADDED_BYTES = 128 << 20  # a page far longer than any (the client once read it all)
_ENDS = {  # a listing page's head and tail, by store
    "s3": (
        b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name>',
        b"</ListBucketResult>",
    ),
    "azure": (
        b'<?xml version="1.0" encoding="utf-8"?><EnumerationResults><Blobs>',
        b"</Blobs><NextMarker/></EnumerationResults>",
    ),
}


def hostile_page(kind: str, store: str = "s3") -> bytes:
    """16 MiB of a listing page: empty elements (``flat``) or nested ones (``nested``); or
    128 MiB of spaces (``padded``); or a page of no key (``empty``: what listing costs)."""
    start, end = _ENDS[store]
    if kind == "empty":
        return start + end
    if kind == "padded":
        return start + b" " * (PADDED_BYTES - len(start) - len(end)) + end
    room = PAGE_BYTES - len(start) - len(end)
    if kind == "flat":
        return start + b"<a/>" * (room // 4) + end
    return start + b"<a>" * (room // 7) + b"</a>" * (room // 7) + end


class _Listing(BaseHTTPRequestHandler):
    """An endpoint answering every request with the server's hostile listing page (chunked
    where the server says so, 1 MiB a chunk)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body: bytes = self.server.page  # type: ignore[attr-defined]
        chunked: bool = self.server.chunked  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # (refused before its end)
            if not chunked:
                self.wfile.write(body)
                return
            view = memoryview(body)
            for start in range(0, len(body), MIB):
                piece = view[start : start + MIB]
                self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")


LISTINGS = {  # key: (label, page, how it is listed: own requests, client, azure)
    "listing-flat": ("S3 listing page of 16 MiB, flat", "flat", "own"),
    "listing-nested": ("S3 listing page of 16 MiB, nested", "nested", "own"),
    "listing-flat-client": (
        "S3 listing page of 16 MiB, flat, through the client",
        "flat",
        "client",
    ),
    "listing-nested-client": (
        "S3 listing page of 16 MiB, nested, through the client",
        "nested",
        "client",
    ),
    "listing-empty-client": ("S3 listing page, empty, through the client", "empty", "client"),
    "listing-padded-client": (
        "S3 listing page of 128 MiB, padded, chunked, through the client",
        "padded",
        "client",
    ),
    "listing-empty-azure": ("Azure listing page, empty", "empty", "azure"),
    "listing-flat-azure": ("Azure listing page of 16 MiB, flat", "flat", "azure"),
    "listing-nested-azure": ("Azure listing page of 16 MiB, nested", "nested", "azure"),
    "listing-padded-azure": ("Azure listing page of 128 MiB, padded, chunked", "padded", "azure"),
}
_AZURITE_KEY = (  # the development account's well-known key (Azurite's)
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def run_listing(label: str, kind: str, how: str) -> dict[str, Any]:
    """One listing row: a glob on an endpoint whose every page is a hostile one."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Listing)
    page = hostile_page(kind, "azure" if how == "azure" else "s3")
    server.page = page  # type: ignore[attr-defined]
    server.chunked = kind == "padded"  # type: ignore[attr-defined]
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    url = "s3://bkt/d/*"
    options: dict[str, Any] = {
        "key": "k",
        "secret": "s",
        "client_kwargs": {"endpoint_url": endpoint},
    }
    if how == "client":  # a setting the store's own requests do not follow: its client lists
        options["config_kwargs"] = {"signature_version": "s3v4"}
    elif how == "azure":
        url = "az://c/d/*"
        options = {
            "connection_string": "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={_AZURITE_KEY};BlobEndpoint={endpoint}/devstoreaccount1;"
        }
    spec = {"url": url, "call": "iterate", "options": {"storage_options": options}}
    try:
        result = run_case(json.dumps(spec))
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    if result["error"]:
        result["error"] = result["error"].replace(endpoint, "<endpoint>")
    result.update(label=label, on_disk=len(page))
    print(
        f"  {label}: +{result['rss_growth_mib']:.0f} MiB, {result['seconds']:.2f} s, "
        f"{_short(result['error'], 100)}",
        flush=True,
    )
    return result


def child(url: str) -> int:
    """Read ``url`` with the defaults (or a sidecar case's spec, JSON: its call and
    options); print what happened as one JSON line."""
    import streamrec

    spec = json.loads(url) if url.startswith("{") else {"url": url, "call": "iterate"}
    ds = streamrec.open_dataset(spec["url"], **spec.get("options", {}))
    if spec.get("before") == "get":  # the table built and kept first (not measured)
        ds.get([0])
    base = reset_peak_rss()
    if base is None:
        raise SystemExit("needs Linux (/proc/self/clear_refs)")
    t0 = time.perf_counter()
    records, error = hostile_indexes.run(ds, spec["call"])
    result = {
        "records": records,
        "error": error,
        "seconds": time.perf_counter() - t0,
        "rss_growth_mib": ((status_kib("VmHWM") or 0) - base) / 1024,
        "prefetch_bytes": ds.options.prefetch_bytes,
        "bytes_read": ds.stats.bytes_read,
    }
    return print_result(result)


def run_case(url: str) -> dict[str, Any]:
    return run_script(__file__, "--child", url, 600, "child")


def _short(error: str | None, width: int = 200) -> str:
    if error is None:
        return "none (read to the end)"
    error = error.replace("|", "\\|").replace("\n", " ")
    return error if len(error) <= width else error[: width - 3] + "..."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the table into this README's section")
    parser.add_argument("--json", type=Path, help=JSON_HELP)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--only", help="comma-separated case keys (default: all)")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child)
    started = time.perf_counter()
    rows = []
    only = set(args.only.split(",")) if args.only else None
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        directory = Path(tmp)
        server = _Server(
            ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(directory / "http"))
        )
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            for key, (label, make) in {**CASES, **hostile_indexes.CASES}.items():
                if only is not None and key not in only:
                    continue
                made = make(directory)
                url = made if isinstance(made, str) else made["url"]
                if key in ("http", "error-body"):
                    url = f"http://127.0.0.1:{server.server_address[1]}/{url}"
                on_disk = sum(
                    f.stat().st_blocks * 512
                    for f in directory.rglob("*")
                    if f.is_file() and f.name.startswith(Path(url).name)
                )
                result = run_case(url if isinstance(made, str) else json.dumps(made))
                if result["error"]:
                    result["error"] = result["error"].replace(str(directory), "<dir>")
                result.update(label=label, on_disk=on_disk)
                rows.append(result)
                print(
                    f"  {label}: +{result['rss_growth_mib']:.0f} MiB, "
                    f"{result['records']} records, {_short(result['error'], 100)}",
                    flush=True,
                )
                for f in directory.glob("*.tfrecord*"):  # the shard and its sidecar
                    f.unlink()
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
    for key, (label, kind, how) in LISTINGS.items():
        if only is None or key in only:
            rows.append(run_listing(label, kind, how))
    lines = [
        f"Command: `{command_line('bench_hostile.py', argv)}` ({now()}, "
        f"{time.perf_counter() - started:.0f} s). "
        "Defaults (`prefetch_bytes` 64 MiB, 4 MiB blocks), one fresh process per case.",
        "",
        "| input | on disk | records before the end | peak RSS +MiB | vs prefetch_bytes "
        "| bytes read | error raised |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['on_disk'] / MIB:,.1f} MiB | {r['records']:,} | "
            f"{r['rss_growth_mib']:.0f} | {r['rss_growth_mib'] * MIB / r['prefetch_bytes']:.2f}x "
            f"| {r['bytes_read'] / MIB:,.1f} MiB | {_short(r['error'])} |"
        )
    section = "\n".join(lines)
    publish(section, args.out, write_readme)
    save_results(args.json, "bench_hostile", section, ["hostile inputs"])
    return 0


def write_readme(path: Path, section: str) -> None:
    replace_section(path, START_MARK, END_MARK, section, "")


if __name__ == "__main__":
    raise SystemExit(main())
