"""Which S3 clients streamrec's own session sends for (storage/s3/session.py
``sender_for``): it follows no redirect and caps what it reads whole, so every client it can
serve gets it; ``http://`` and ``https://`` proxies, from the options or the environment, and
client certificates included."""

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
        ({"proxies": {"https": "https://proxy:3128"}}, {}),  # (its TLS: the endpoint's trust)
        ({}, {"HTTPS_PROXY": "https://proxy:3128"}),
        ({"client_cert": "/cert.pem"}, {}),
        ({"client_cert": ("/cert.pem", "/key.pem")}, {}),
        ({"client_cert": "/cert.pem", "proxies": {"https": "http://proxy:3128"}}, {}),
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
        ({"proxies": {"http": "http://p:1"}, "proxies_config": {"proxy_ca_bundle": "x"}}, {}),
        ({}, {"all_proxy": "socks5://proxy:1080"}),
        # aiohttp's TLS to the proxy would offer it the endpoint's certificate
        ({"client_cert": "/cert.pem", "proxies": {"https": "https://proxy:3128"}}, {}),
        ({"client_cert": "/cert.pem"}, {"HTTPS_PROXY": "https://proxy:3128"}),
        ({"client_cert": ["/cert.pem", "/key.pem"]}, {}),  # (not a pair aiobotocore takes)
        ({"connector_args": {"keepalive_timeout": 5}}, {}),
    ],
)
def test_what_it_cannot_send_keeps_aiobotocores_session(
    config: dict[str, Any], environ: dict[str, str]
) -> None:
    assert sender_for({**BASE, "config_kwargs": config}, environ, 10, TIMEOUTS) is None


@pytest.mark.parametrize(
    ("text", "served"), [("client_cert = /c.pem", True), ("proxy_ca_bundle = x", False)]
)
def test_a_config_file_falls_back_only_for_what_botocore_reads_there(
    tmp_path: Any, text: str, served: bool
) -> None:
    # botocore reads no client certificate from the AWS config file (proxy settings there:
    # left to its session)
    path = tmp_path / "config"
    path.write_text(f"[default]\n{text}\n")
    environ = {"AWS_CONFIG_FILE": str(path)}
    sender = sender_for({**BASE, "config_kwargs": {}}, environ, 10, TIMEOUTS)
    assert isinstance(sender, NoRedirectSender) is served
