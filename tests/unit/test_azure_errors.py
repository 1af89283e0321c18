"""azure.core's exceptions -> streamrec's tree, by type (no server: the exceptions the SDK
raises when no HTTP answer arrived; answered ones are translated by status and are exercised
against Azurite in tests/integration)."""

from __future__ import annotations

import pytest
from azure.core import exceptions as azure

from streamrec.errors import (
    PermissionDeniedError,
    StorageError,
    TransientStorageError,
)
from streamrec.redact import redact
from streamrec.storage.registry import open_store, store_key
from streamrec.storage.translate import translate

URL = "az://container/shard.tfrecord"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (azure.ServiceRequestError("connection refused"), TransientStorageError),
        (azure.ServiceRequestTimeoutError("connect timed out"), TransientStorageError),
        (azure.ServiceResponseError("connection reset mid-body"), TransientStorageError),
        (azure.ServiceResponseTimeoutError("read timed out"), TransientStorageError),
        (azure.IncompleteReadError("body cut short"), TransientStorageError),
        (azure.ClientAuthenticationError("no credential found"), PermissionDeniedError),
        (azure.DecodeError("not XML"), StorageError),
    ],
)
def test_azure_exceptions_are_translated_by_type_naming_the_url(
    exc: BaseException, expected: type[StorageError]
) -> None:
    error = translate(exc, URL, "reading bytes 0-9")
    assert type(error) is expected
    assert URL in str(error) and "reading bytes 0-9" in str(error)
    assert error.__cause__ is exc


def test_az_and_abfs_urls_share_one_store_kind() -> None:
    assert {store_key(u) for u in ("az://c/k", "abfs://c/k", "abfss://c/k")} == {"azure"}


def test_a_store_without_credentials_fails_as_a_storage_error() -> None:
    with pytest.raises(StorageError, match="Azure"):
        open_store("az://container/k", {"account_name": None, "connection_string": None})


def test_an_abfs_container_at_its_account_is_not_taken_for_a_credential() -> None:
    url = "abfs://train@myaccount.dfs.core.windows.net/data/part-0.tfrecord"
    assert redact(f"{url}: failed") == f"{url}: failed"
    assert redact("see https://user:tok@host/x and " + url) == ("see https://***@host/x and " + url)


def test_the_cache_tells_azure_accounts_apart_without_their_keys() -> None:
    from streamrec.storage.cache.store import cache_namespace

    key = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    emulator = {
        "connection_string": f"AccountName=devstoreaccount1;AccountKey={key};"
        "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
    }
    assert cache_namespace(URL, emulator) == "http://127.0.0.1:10000/devstoreaccount1"
    assert cache_namespace(URL, {"account_name": "a", "account_key": key}) == "a"
    assert cache_namespace(URL, {"account_name": "b", "sas_token": "sig=x"}) == "b"


async def test_the_capped_transport_makes_its_session_once_and_stays_closed_after_close() -> None:
    from streamrec.storage.azure.listing import capped_transport

    transport = capped_transport()
    await transport.open()
    first = transport.session
    await transport.open()  # every request opens it: the same session
    assert transport.session is first
    await transport.close()
    assert first.closed
    # as the SDK's own transport says: a closed client's transport opens no session nobody closes
    with pytest.raises(ValueError, match="closed"):
        await transport.open()
    assert transport.session is None
