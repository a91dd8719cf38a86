"""The HTTP API over TLS: `keyload run --tls-cert --tls-key` serves https://, and a client that
trusts the certificate uses it with the same typed API; one that does not refuses the server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from keyload import Client, Credential, KeyloadError
from keyload.errors import ServiceUnavailable

from .support import run_keyload, self_signed, served_url, start_service, stop_service


def test_https_with_a_trusted_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    root = tmp_path / "data"
    process = start_service(root, "--listen", "127.0.0.1:0", "--tls-cert", str(cert), "--tls-key", str(key))
    try:
        url = served_url(root)
        assert url.startswith("https://127.0.0.1:")
        credential = Credential.load(root / "credentials" / "keyload-admin.json")
        with Client(url, credential=credential, verify=str(cert)) as client:
            client.create_queue("tls", "q")
            client.enqueue("tls", "q", b"secret body", message_id="m")
            assert client.receive("tls", "q").deliveries[0].body == b"secret body"
        with Client(url, credential=credential, verify=cert) as by_path:  # a Path names the bundle too
            assert by_path.inspect_queue("tls", "q").queue == "q"
        with pytest.raises(KeyloadError, match=r"verify='.*nowhere.pem' is no CA bundle this client can load"):
            Client(url, credential=credential, verify=tmp_path / "nowhere.pem")
        # Not a passing fault to resubmit through (ServiceUnavailable) but a refusal naming the fix.
        with Client(url, credential=credential) as untrusting, pytest.raises(KeyloadError) as refused:
            untrusting.inspect_queue("tls", "q")
        assert not isinstance(refused.value, ServiceUnavailable)
        assert "presented a certificate this client does not trust (self-signed certificate)" in str(refused.value)
        assert "pass verify= the CA bundle that signed it; nothing was sent" in str(refused.value)
        with pytest.raises(httpx.HTTPError):
            httpx.get(url.replace("https://", "http://") + "/healthz", timeout=5)
    finally:
        assert stop_service(process) == 0


def test_tls_needs_a_certificate_and_its_key(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path)
    refused = run_keyload("run", "--data", str(tmp_path / "data"), "--tls-cert", str(cert))
    assert refused.returncode == 2
    assert "TLS needs both --tls-cert and --tls-key" in refused.stderr


def test_the_served_url_names_the_host_as_listen_named_it(tmp_path: Path) -> None:
    """A certificate may name only `localhost`: the URL local tools read from DATA/server.json keeps
    the name `--listen` gave, not the address it resolved to."""
    root = tmp_path / "data"
    process = start_service(root, "--listen", "localhost:0")
    try:
        url = served_url(root)
        assert url.startswith("http://localhost:")
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    finally:
        assert stop_service(process) == 0
