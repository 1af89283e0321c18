"""Which S3 clients streamrec's own session sends for (storage/s3/session.py
``sender_for``): it follows no redirect and caps what it reads whole, so every client it can
serve gets it; ``http://`` proxies, from the options or the environment, included."""

from __future__ import annotations

from typing import Any

import pytest

from streamrec.storage.s3.session import NoRedirectSender, sender_for

BASE: dict[str, Any] = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "http://h:1"}}
TIMEOUTS = (5.0, 30.0)


@pytest.mark.parametrize(
    ("config", "environ"),
    [
        ({}, {}),
        ({"proxies": {"http": "http://u:p@proxy:3128", "https": "proxy:3128"}}, {}),
        ({}, {"HTTP_PROXY": "http://proxy:3128", "NO_PROXY": "h"}),
        ({}, {"https_proxy": "proxy:3128"}),
        ({"proxies": {}}, {"all_proxy": "socks5://proxy:1080"}),  # (the options' win)
    ],
)
def test_the_session_sends_for_plain_clients_and_http_proxies(
    config: dict[str, Any], environ: dict[str, str]
) -> None:
    sender = sender_for({**BASE, "config_kwargs": config}, environ, 10, TIMEOUTS)
    assert isinstance(sender, NoRedirectSender)


@pytest.mark.parametrize(
    ("config", "environ"),
    [
        ({"proxies": {"https": "https://proxy:3128"}}, {}),  # its TLS: aiobotocore's
        ({"proxies": {"http": "http://p:1"}, "proxies_config": {"proxy_ca_bundle": "x"}}, {}),
        ({}, {"HTTPS_PROXY": "https://proxy:3128"}),
        ({}, {"all_proxy": "socks5://proxy:1080"}),
        ({"client_cert": "/cert.pem"}, {}),
        ({"connector_args": {"keepalive_timeout": 5}}, {}),
    ],
)
def test_what_it_cannot_send_keeps_aiobotocores_session(
    config: dict[str, Any], environ: dict[str, str]
) -> None:
    assert sender_for({**BASE, "config_kwargs": config}, environ, 10, TIMEOUTS) is None
