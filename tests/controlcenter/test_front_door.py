"""SB-4 and SB-5 against the real served app (uvicorn, the ASGI stack, /mcp): the lockout after
failed sign-ins and wrong tokens, the body-size limit before the body is read, and a catastrophic
regex through /mcp that leaves /healthz answering.

Each test talks from its own loopback address (127.0.0.N), so one test's lockout of its
user+address pair never touches another's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.embedded import EMBEDDED_ADMIN_PASSWORD, ROOT
from tests.support.timing import scaled

# Starting the server and seeding it spawn three Django processes: on a loaded machine that alone
# can pass the default 120 s.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
FAILURES = 100


def _client(base: str, address: str, **kwargs) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=base, transport=transport, timeout=scaled(10), **kwargs)


def _manage(folder: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(CC_VAR_DIR=str(folder / "var"), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "controlcenter.cli", "manage", "shell", "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


@pytest.fixture(scope="module")
def server(embedded_server_module):
    base, log = embedded_server_module
    folder = log.parent
    seeded = _manage(
        folder,
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "from rest_framework.authtoken.models import Token\n"
        "User = get_user_model()\n"
        "User.objects.create_user('carol', password='carol-password-1')\n"
        "User.objects.create_user('dave', password='dave-password-1', is_staff=True)\n"
        "admin = User.objects.get(username='admin')\n"
        "print(json.dumps([Token.objects.get_or_create(user=admin)[0].key, admin.pk]))\n",
    )
    token, admin_id = json.loads(seeded)
    return base, folder, token, admin_id


def _sign_in(http: httpx.Client, path: str, username: str, password: str) -> httpx.Response:
    http.get(path)
    return http.post(
        path,
        data={"username": username, "password": password, "csrfmiddlewaretoken": http.cookies["csrftoken"]},
        headers={"Referer": str(http.base_url)},
    )


@pytest.mark.req("SB-5")
def test_a_hundred_wrong_passwords_lock_the_user_and_address_out_even_for_the_right_one(server):
    base, _, _, _ = server
    with _client(base, "127.0.0.2") as http:
        statuses = [_sign_in(http, "/login/", "carol", f"guess-{n}").status_code for n in range(FAILURES)]
        assert statuses[0] == 200 and statuses[-1] == 429, statuses
        refused = _sign_in(http, "/login/", "carol", "carol-password-1")
        assert refused.status_code == 429 and "locked out for 15 minutes" in refused.text
        assert "sessionid" not in http.cookies
        assert http.get("/api/conversations/").status_code in (401, 403)
        # The admin login counts the same failures: it refuses carol's right password here too.
        assert _sign_in(http, "/admin/login/", "carol", "carol-password-1").status_code == 429
        # Only the pair is locked: another user signs in from the same address.
        assert _sign_in(http, "/login/", "admin", EMBEDDED_ADMIN_PASSWORD).status_code == 302
    with _client(base, "127.0.0.3") as elsewhere:  # and carol from another address
        assert _sign_in(elsewhere, "/login/", "carol", "carol-password-1").status_code == 302


@pytest.mark.req("SB-5")
def test_the_admin_login_locks_out_too(server):
    base, _, _, _ = server
    with _client(base, "127.0.0.4") as http:
        statuses = [_sign_in(http, "/admin/login/", "dave", f"guess-{n}").status_code for n in range(6)]
        assert statuses[-1] == 429, statuses
        assert _sign_in(http, "/admin/login/", "dave", "dave-password-1").status_code == 429
        assert _sign_in(http, "/login/", "dave", "dave-password-1").status_code == 429


@pytest.mark.req("SB-5")
def test_wrong_api_tokens_lock_the_address_out_of_guessing_on_rest_and_mcp_but_never_a_valid_token(server):
    base, _, token, _ = server
    with _client(base, "127.0.0.5") as http:
        wrong = [http.get("/api/conversations/", headers={"Authorization": f"Token {n:040x}"}) for n in range(6)]
        assert wrong[0].status_code == 401 and wrong[-1].status_code == 429, [r.status_code for r in wrong]
        # One code for the whole lockout: the attempt that triggered it and every one after.
        assert wrong[-1].json()["error"]["code"] == "locked_out"
        guess = http.get("/api/conversations/", headers={"Authorization": f"Token {99:040x}"})
        assert guess.status_code == 429 and guess.json()["error"]["code"] == "locked_out"
        assert "locked out" in guess.json()["error"]["message"]
        mcp_guess = http.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=_mcp_headers(f"{99:040x}")
        )
        assert mcp_guess.status_code == 401 and "locked out" in mcp_guess.text
        # QA: every API client behind that address (a proxy, a NAT) was locked out with it, by one
        # stale script. A valid token names its user and cannot be guessed: it is never refused.
        assert http.get("/api/conversations/", headers={"Authorization": f"Token {token}"}).status_code == 200
        mcp = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=_mcp_headers(token))
        assert mcp.status_code == 200, mcp.text
        # Nor does its success lift the lock on guessing.
        assert http.get("/api/conversations/", headers={"Authorization": f"Token {98:040x}"}).status_code == 429


def _mcp_headers(token: str) -> dict:
    return {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Authorization": f"Bearer {token}",
    }


def _disk_use(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _raw_request(base: str, head: str) -> socket.socket:
    url = urlsplit(base)
    sock = socket.create_connection((url.hostname, url.port), timeout=10, source_address=("127.0.0.7", 0))
    sock.sendall(head.encode())
    return sock


def _response(sock: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
        next((line.split(b":")[1] for line in data.split(b"\r\n") if line.lower().startswith(b"content-length")), b"0")
    ):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


@pytest.mark.req("SB-5")
def test_a_one_and_a_half_gib_upload_is_refused_before_it_is_read(server):
    base, folder, _, _ = server
    size = 3 * 2**29  # 1.5 GiB, never built in memory
    before = _disk_use(folder)
    # Declared: answered at once from the headers, anonymous or not.
    sock = _raw_request(
        base,
        f"POST /api/conversations/ HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n",
    )
    status, body = _response(sock)
    sock.close()
    assert status == 413 and body["error"]["code"] == "request_too_large", body
    # Chunked (no length): counted as it streams and cut off at the limit.
    sock = _raw_request(
        base, "POST /login/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * 2**20
    frame = b"%x\r\n" % len(piece) + piece + b"\r\n"
    sent = 0
    try:
        while sent < size:
            sock.sendall(frame)
            sent += len(piece)
            sock.settimeout(0)
            try:
                if sock.recv(1, socket.MSG_PEEK):
                    break
            except BlockingIOError:
                pass
            finally:
                sock.settimeout(10)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < 64 * 2**20, f"the server read {sent} bytes before refusing"
    status, body = _response(sock)
    sock.close()
    assert status == 413 and "CC_MAX_REQUEST_BYTES" in body["error"]["message"]
    assert _disk_use(folder) - before < 10 * 2**20
    began = time.monotonic()
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    assert time.monotonic() - began < scaled(1.0)  # the server is not still busy with the upload


@pytest.mark.req("SB-5")
def test_healthz_tells_anonymous_callers_only_up_or_down(server):
    base, _, token, _ = server
    anonymous = httpx.get(f"{base}/healthz", timeout=5).json()
    assert anonymous["status"] == "ok"
    assert all(
        set(check) <= {"ok"} or all(isinstance(v, bool | int) for v in check.values())
        for check in anonymous["checks"].values()
    )
    assert "vendor" not in json.dumps(anonymous)
    staff = httpx.get(f"{base}/healthz", headers={"Authorization": f"Token {token}"}, timeout=5).json()
    assert staff["checks"]["database"]["vendor"] == "sqlite"
    # This machine gives the server a writable cgroup: the sandbox's limits are per call.
    assert staff["checks"]["sandbox"]["limits"].startswith("per call, in a cgroup of its own"), staff


@pytest.mark.req("SB-4")
def test_a_catastrophic_regex_through_mcp_leaves_healthz_answering_within_a_second(server):
    base, folder, token, admin_id = server
    workspace = folder / "var" / "workspaces" / f"mcp-user-{admin_id}"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "evil.txt").write_text(("a" * 40 + "!\n") * 200)
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "search_files", "arguments": {"pattern": "(a+)+$"}},
    }
    # A process's first /mcp request loads the MCP SDK (about 1 CPU-s, in a thread); on a loaded
    # machine that import alone held /healthz for 1.0 s. What is measured here is the regex.
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    assert httpx.post(f"{base}/mcp", json=listing, headers=_mcp_headers(token), timeout=60).status_code == 200
    answer: dict = {}
    caller = threading.Thread(
        target=lambda: answer.update(
            response=httpx.post(f"{base}/mcp", json=call, headers=_mcp_headers(token), timeout=60)
        )
    )
    caller.start()
    latencies = []
    while caller.is_alive() or len(latencies) < 3:
        began = time.monotonic()
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        latencies.append(time.monotonic() - began)
        time.sleep(0.05)
    caller.join()
    # Within a second on the reference machine (tests/support/timing.py); 20 s before the fix.
    assert max(latencies) < scaled(1.0), latencies
    assert answer["response"].status_code == 200, answer["response"].text
    assert "structuredContent" in answer["response"].text
