"""What the caller asked every S3 request to carry, on every request streamrec sends itself.

s3fs adds its ``storage_options``' ``requester_pays=True`` (``RequestPayer``) and
``s3_additional_kwargs`` (SSE-C's ``SSECustomerAlgorithm``, ``SSECustomerKey``,
``SSECustomerKeyMD5``, ``ExpectedBucketOwner``...) to the calls it makes, each call taking
those its operation accepts. streamrec's own requests (listing pages, range GETs, first bytes,
multipart uploads, open uploads) carry them the same way: as botocore parameters, filtered by
the operation's input shape in botocore's service model (:meth:`RequestParams.for_call`), or,
for the range GETs signed here, as the headers botocore would send for them
(:meth:`RequestParams.get_headers`: the SSE-C key base64-encoded with its MD5 added, as
botocore's ``sse_md5`` handler does). A bucket whose owner pays nothing for others' requests
refuses reads without ``x-amz-request-payer``; an SSE-C object refuses reads without its key.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any

__all__ = ["RequestParams", "extra_params"]


def extra_params(fs: Any) -> dict[str, Any]:
    """The parameters every request of the s3fs filesystem ``fs`` carries, as s3fs merges
    them: its ``s3_additional_kwargs``, with ``RequestPayer`` for ``requester_pays``."""
    params = dict(getattr(fs, "s3_additional_kwargs", None) or {})
    params.update(getattr(fs, "req_kw", None) or {})
    return params


class RequestParams:
    """The caller's parameters (:func:`extra_params`), as each S3 operation takes them."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        self._params = dict(params)
        self._by_method: dict[str, dict[str, Any]] = {}
        self._get_headers: dict[str, str] | None = None
        self._get_headers_known = False

    def __bool__(self) -> bool:
        return bool(self._params)

    def for_call(self, client: Any, method: str) -> dict[str, Any]:
        """The parameters that ``client.<method>`` (``"get_object"``, ...) accepts."""
        kept = self._by_method.get(method)
        if kept is None:
            members = _input_members(client, method) if self._params else {}
            kept = self._by_method[method] = {
                name: value for name, value in self._params.items() if name in members
            }
        return dict(kept)

    def get_headers(self, client: Any) -> dict[str, str] | None:
        """The headers that carry ``GetObject``'s parameters on a GET signed here (``{}``:
        none); None when one is not sent as a header (then ``get_object`` sends them)."""
        if not self._get_headers_known:
            self._get_headers = _as_headers(client, self.for_call(client, "get_object"))
            self._get_headers_known = True
        return None if self._get_headers is None else dict(self._get_headers)


def _input_members(client: Any, method: str) -> Mapping[str, Any]:
    """The input members of the operation behind ``client.<method>`` (botocore's model)."""
    operation = client.meta.service_model.operation_model(client.meta.method_to_api_mapping[method])
    shape = operation.input_shape
    return {} if shape is None else shape.members


def _as_headers(client: Any, params: dict[str, Any]) -> dict[str, str] | None:
    if not params:
        return {}
    params = _sse_customer_key(params)
    members = _input_members(client, "get_object")
    headers = {}
    for name, value in params.items():
        serialization = members[name].serialization
        if serialization.get("location") != "header" or not isinstance(value, str):
            return None  # (a query parameter, a timestamp...): get_object serialises it
        headers[serialization.get("name", name)] = value  # (botocore: the locationName)
    return headers


def _sse_customer_key(params: dict[str, Any]) -> dict[str, Any]:
    """An SSE-C key as botocore sends it: base64-encoded, with the MD5 of the key, unless
    the caller gave the MD5 (then the key is sent as given)."""
    key = params.get("SSECustomerKey")
    if key is None or "SSECustomerKeyMD5" in params:
        return params
    raw = key.encode() if isinstance(key, str) else bytes(key)
    digest = hashlib.md5(raw, usedforsecurity=False).digest()
    return {
        **params,
        "SSECustomerKey": base64.b64encode(raw).decode(),
        "SSECustomerKeyMD5": base64.b64encode(digest).decode(),
    }
