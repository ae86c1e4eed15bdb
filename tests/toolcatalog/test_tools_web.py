"""fetch_url: size cap, and no way into loopback, private or link-local networks (RN-5)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from toolcatalog.builtins import WorkspaceToolBox
from toolcatalog.tools.web import fetch_url

PAGE = (
    "<html><head><style>p{}</style><script>alert(1)</script></head><body><nav>Menu</nav>"
    "<h1>Title</h1><p>Hello <a href='/x'>link</a></p><ul><li>one</li></ul></body></html>"
)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # keep the test output clean
        pass

    def do_GET(self):  # noqa: N802 - the http.server hook name
        self.server.seen.append((self.path, self.headers.get("Host")))
        routes = {
            "/page": (200, "text/html; charset=utf-8", PAGE.encode()),
            "/data": (200, "application/json", json.dumps({"answer": 42}).encode()),
            "/big": (200, "text/plain", b"y" * 50_000),
            "/image": (200, "image/png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 100),
            "/missing": (404, "text/plain", b"no such page"),
        }
        if self.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b"z" * 10)
                self.wfile.flush()
                time.sleep(0.1)
            return
        if self.path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", self.path.split("=", 1)[1])
            self.end_headers()
            return
        status, content_type, body = routes.get(self.path, (404, "text/plain", b"?"))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.seen = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def box(tmp_path: Path) -> WorkspaceToolBox:
    return WorkspaceToolBox(tmp_path)


@pytest.fixture
def loopback_allowed(settings):
    settings.CC_FETCH_ALLOWED_NETWORKS = ["127.0.0.1/32"]


def _url(server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_port}{path}"


@pytest.mark.req("RN-5")
def test_loopback_is_refused_without_an_allowlist_and_never_contacted(box, server):
    refused = box.execute("fetch_url", {"url": _url(server, "/page")})
    assert refused["ok"] is False
    assert "loopback" in refused["error"]
    assert server.seen == []


@pytest.mark.req("RN-5")
@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://10.1.2.3/", "private"),
        ("http://192.168.0.1/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[::1]/", "loopback"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://0.0.0.0/", "unspecified"),
    ],
)
def test_internal_address_literals_are_refused(box, url, reason):
    refused = box.execute("fetch_url", {"url": url})
    assert refused["ok"] is False
    assert reason in refused["error"]


@pytest.mark.req("RN-5")
def test_a_name_whose_dns_answer_is_loopback_is_refused(box, server):
    refused = box.execute("fetch_url", {"url": f"http://localhost:{server.server_port}/page"})
    assert refused["ok"] is False
    assert "resolves to" in refused["error"]
    assert server.seen == []


@pytest.mark.req("RN-5")
def test_dns_answers_are_checked_and_the_checked_address_is_the_one_contacted(tmp_path, server, loopback_allowed):
    from toolcatalog.tools.base import BuiltinTool

    answers = {"app.test": ["127.0.0.1"], "internal.example": ["10.0.0.7"], "mixed.example": ["127.0.0.1", "10.0.0.7"]}

    def resolver(host, port):
        return answers[host]

    tool = BuiltinTool("fetch", "", {"type": "object"}, lambda args, ctx: fetch_url(args, ctx, resolver=resolver))
    fetched = tool.call({"url": f"http://app.test:{server.server_port}/data", "format": "json"}, tmp_path)
    assert fetched["ok"] is True and fetched["json"] == {"answer": 42}
    # Connected to the checked address, while the server still sees the name asked for.
    assert server.seen == [("/data", f"app.test:{server.server_port}")]
    for host in ["internal.example", "mixed.example"]:
        refused = tool.call({"url": f"http://{host}:{server.server_port}/data"}, tmp_path)
        assert refused["ok"] is False and "10.0.0.7" in refused["error"] and "private" in refused["error"]
    assert len(server.seen) == 1


@pytest.mark.req("RN-5")
def test_a_redirect_to_an_internal_address_is_refused(box, server, loopback_allowed):
    refused = box.execute("fetch_url", {"url": _url(server, "/redirect?to=http://169.254.169.254/latest/")})
    assert refused["ok"] is False
    assert "169.254.169.254" in refused["error"] and "link-local" in refused["error"]
    refused_name = box.execute("fetch_url", {"url": _url(server, "/redirect?to=http://localhost:9/")})
    assert refused_name["ok"] is False


@pytest.mark.req("RN-5")
def test_allowlisted_fetch_converts_html_follows_safe_redirects_and_reports_status(box, server, loopback_allowed):
    page = box.execute("fetch_url", {"url": _url(server, "/redirect?to=/page")})
    assert page["ok"] is True
    assert page["status"] == 200
    assert page["redirects"] == [_url(server, "/page")]
    assert page["format"] == "markdown"
    assert "# Title" in page["content"] and "[link](/x)" in page["content"] and "- one" in page["content"]
    assert "alert" not in page["content"] and "Menu" not in page["content"]
    missing = box.execute("fetch_url", {"url": _url(server, "/missing")})
    assert missing["ok"] is False and missing["status"] == 404 and "404" in missing["error"]
    binary = box.execute("fetch_url", {"url": _url(server, "/image")})
    assert binary["ok"] is False and "binary" in binary["error"] and "image/png" in binary["error"]


@pytest.mark.req("RN-5")
def test_the_body_is_cut_at_max_bytes_and_the_cut_is_said(box, server, loopback_allowed, settings):
    capped = box.execute("fetch_url", {"url": _url(server, "/big"), "max_bytes": 4096})
    assert capped["ok"] is True
    assert capped["bytes"] == 4096 and capped["content"] == "y" * 4096
    assert capped["truncated"] is True and "4096" in capped["_note"]
    settings.CC_FETCH_MAX_BYTES = 2048
    server_capped = box.execute("fetch_url", {"url": _url(server, "/big"), "max_bytes": 40_000})
    assert server_capped["bytes"] == 2048 and server_capped["truncated"] is True


@pytest.mark.req("RN-5")
def test_only_http_urls_are_fetched(box):
    for url in ["file:///etc/passwd", "ftp://example.com/", "gopher://x/"]:
        refused = box.execute("fetch_url", {"url": url})
        assert refused["ok"] is False and "http" in refused["error"]


@pytest.mark.req("RN-5")
def test_a_malformed_allowlist_setting_stops_the_server_from_starting(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "CC_FETCH_ALLOWED_NETWORKS": "10.0.0.0/8,not-a-network", "CC_VAR_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    result = subprocess.run(
        [sys.executable, "-c", "import controlcenter.settings"],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        timeout=60,
    )
    assert result.returncode != 0
    assert "CC_FETCH_ALLOWED_NETWORKS" in result.stderr and "not-a-network" in result.stderr


@pytest.mark.req("RN-5")
def test_a_server_dripping_bytes_cannot_hold_the_tool_past_its_timeout(box, server, loopback_allowed):
    started = time.monotonic()
    slow = box.execute("fetch_url", {"url": _url(server, "/drip"), "timeout_seconds": 1})
    assert time.monotonic() - started < 3
    assert slow["ok"] is False and "within 1 s" in slow["error"]
