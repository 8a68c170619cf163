"""A schema registry's credentials (`avro.registry.auth_env`) go only where they are meant to:
over https or to a registry on this host, and never on to the host a redirect names. Plain
HTTP servers on loopback in this process stand in for a registry and for where it redirects."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lakehouse.events.avro import Registry
from lakehouse.events.schema_registry import RegistryError, fetch

SECRET = "orders:registry-pw-5"


class Server:
    """A loopback HTTP server answering every GET with `answer(path, headers)`: (status,
    headers, body); it keeps the Authorization header of each request it got."""

    def __init__(self, answer):
        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.headers.get("Authorization"))
                status, headers, body = answer(self.path)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_redirect_never_carries_the_credentials_on(monkeypatch):
    monkeypatch.setenv("ORDERS_REGISTRY_AUTH", SECRET)
    elsewhere = Server(lambda path: (401, {}, b'{"message": "who are you"}'))
    registry = Server(lambda path: (302, {"Location": elsewhere.url + path}, b""))
    try:
        with pytest.raises(RegistryError, match="HTTP 401") as err:
            fetch(Registry(url=registry.url, subject="orders-value",
                           auth_env="ORDERS_REGISTRY_AUTH"))
    finally:
        registry.close()
        elsewhere.close()
    assert registry.seen and all(h and h.startswith("Basic ") for h in registry.seen)
    assert elsewhere.seen == [None]  # followed, without the header
    assert "registry-pw-5" not in str(err.value)


def test_credentials_go_over_https_or_to_this_host_only(monkeypatch):
    monkeypatch.setenv("ORDERS_REGISTRY_AUTH", SECRET)
    remote = Registry(url="http://registry.example.com:8081/apis/ccompat/v7",
                      subject="orders-value", auth_env="ORDERS_REGISTRY_AUTH")
    with pytest.raises(RegistryError, match="only over https or to a registry on this host, "
                                            "not over http to registry.example.com"):
        fetch(remote)  # refused before any connection
    # Without credentials nothing is at stake: the same URL is only unreachable here.
    plain = Server(lambda path: (200, {"Content-Type": "application/json"}, json.dumps(
        [] if path.endswith("/versions") else {}).encode()))
    try:
        with pytest.raises(RegistryError, match="no schema|holds no"):
            fetch(Registry(url=plain.url, subject="orders-value"))
    finally:
        plain.close()
    assert plain.seen == [None]
