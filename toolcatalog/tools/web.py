"""fetch_url: HTTP(S) GET with a size cap that cannot be pointed at the server's own network.

Every hop (the first URL and each redirect) is resolved first, and every address the
name resolves to must be public unless `CC_FETCH_ALLOWED_NETWORKS` lists it; the
connection then goes to the address that was checked (the Host header and TLS name
stay the original host), so a DNS answer that changes between check and connect
cannot slip a private address in (rebinding).
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import time
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin

import httpx
from django.conf import settings

from toolcatalog.tools.base import Observation, ToolContext, ToolFailure, builtin

MAX_REDIRECTS = 5
DEFAULT_TIMEOUT_SECONDS = 30
_REDIRECTS = {301, 302, 303, 307, 308}
# Headers the caller may not set: we set Host to the checked name ourselves.
_FORBIDDEN_HEADERS = {"host", "connection", "transfer-encoding", "content-length", "upgrade", "te", "trailer"}
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml", "application/javascript")

Resolver = Callable[[str, int], list[str]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolFailure(f"Cannot resolve host {host!r}: {exc.strerror or exc}.") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _allowed_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(item, strict=False) for item in settings.CC_FETCH_ALLOWED_NETWORKS]


def _why_forbidden(address: IPAddress) -> str | None:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if any(address in network for network in _allowed_networks()):
        return None
    for label, flag in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    ):
        if flag:
            return label
    return None if address.is_global else "non-public"


def check_destination(url: httpx.URL, resolver: Resolver) -> str:
    """The checked address to connect to for `url`, or ToolFailure saying why it is refused."""
    if url.scheme not in ("http", "https"):
        raise ToolFailure(f"Only http and https URLs can be fetched, not {url.scheme or 'a relative URL'!r}.")
    if not url.host:
        raise ToolFailure(f"URL {str(url)!r} has no host.")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        ipaddress.ip_address(url.host)
        addresses = [url.host]
    except ValueError:
        addresses = resolver(url.host, port)
    if not addresses:
        raise ToolFailure(f"Host {url.host!r} resolves to no address.")
    for text in addresses:
        reason = _why_forbidden(ipaddress.ip_address(text.split("%")[0]))
        if reason:
            raise ToolFailure(
                f"Refused to fetch {str(url)!r}: {url.host} resolves to {text}, a {reason} address. "
                "Fetching the server's own or internal network is not allowed "
                "(CC_FETCH_ALLOWED_NETWORKS can permit a network)."
            )
    return addresses[0]


class _Readable(HTMLParser):
    """HTML to compact Markdown-ish text: headings, links, list items; chrome and scripts dropped."""

    _SKIP = {"script", "style", "nav", "header", "footer", "aside", "noscript", "svg", "form", "iframe", "template"}
    _BLOCK = {"p", "div", "section", "article", "main", "br", "tr", "table", "ul", "ol", "pre", "blockquote"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip_depth = 0
        self.href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self.skip_depth += 1
        elif self.skip_depth:
            return
        elif tag in self._BLOCK:
            self.parts.append("\n\n")
        elif re.fullmatch(r"h[1-6]", tag):
            self.parts.append("\n\n" + "#" * int(tag[1]) + " ")
        elif tag == "li":
            self.parts.append("\n- ")
        elif tag == "a":
            self.href = dict(attrs).get("href")
            self.parts.append("[")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self.skip_depth = max(0, self.skip_depth - 1)
        elif not self.skip_depth and tag == "a":
            self.parts.append(f"]({self.href})" if self.href else "]")
            self.href = None

    def handle_data(self, data: str) -> None:
        if not self.skip_depth:
            self.parts.append(re.sub(r"\s+", " ", data))

    def text(self) -> str:
        joined = "".join(self.parts)
        joined = re.sub(r"[ \t]+\n", "\n", joined)
        return re.sub(r"\n{3,}", "\n\n", joined).strip()


def html_to_markdown(html: str) -> str:
    parser = _Readable()
    parser.feed(html)
    parser.close()
    return parser.text()


def _clean_headers(headers: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in _FORBIDDEN_HEADERS}


def fetch(
    url: str,
    *,
    max_bytes: int,
    timeout: float,
    headers: dict[str, str] | None = None,
    resolver: Resolver = system_resolver,
) -> tuple[httpx.Response, bytes, bool, list[str]]:
    """GET `url` hop by hop, checking every destination; returns (response, body, truncated, redirects)."""
    redirects: list[str] = []
    current = httpx.URL(url)
    # httpx's timeout is per read; a server dripping bytes must not hold the tool past `timeout`.
    deadline = time.monotonic() + timeout
    with httpx.Client(trust_env=False, follow_redirects=False, timeout=timeout) as client:
        for _ in range(MAX_REDIRECTS + 1):
            address = check_destination(current, resolver)
            pinned = current.copy_with(host=address)
            request_headers = {**_clean_headers(headers or {}), "Host": current.netloc.decode("ascii")}
            extensions = {"sni_hostname": current.host} if current.scheme == "https" else {}
            with client.stream("GET", pinned, headers=request_headers, extensions=extensions) as response:
                location = response.headers.get("location")
                if response.status_code in _REDIRECTS and location:
                    current = httpx.URL(urljoin(str(current), location))
                    redirects.append(str(current))
                    continue
                body = bytearray()
                truncated = False
                for chunk in response.iter_bytes():
                    if time.monotonic() > deadline:
                        raise ToolFailure(f"{url!r} did not finish sending within {timeout} s.")
                    body.extend(chunk)
                    if len(body) > max_bytes:
                        truncated = True
                        del body[max_bytes:]
                        break
                return response, bytes(body), truncated, redirects
    raise ToolFailure(f"More than {MAX_REDIRECTS} redirects starting at {url!r}; giving up.")


def fetch_url(arguments: dict[str, Any], context: ToolContext, *, resolver: Resolver = system_resolver) -> Observation:
    max_bytes = min(arguments.get("max_bytes", settings.CC_FETCH_MAX_BYTES), settings.CC_FETCH_MAX_BYTES)
    timeout = arguments.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    try:
        response, body, truncated, redirects = fetch(
            arguments["url"], max_bytes=max_bytes, timeout=timeout, headers=arguments.get("headers"), resolver=resolver
        )
    except httpx.InvalidURL as exc:
        raise ToolFailure(f"Invalid URL {arguments['url']!r}: {exc}") from exc
    except httpx.TimeoutException as exc:
        raise ToolFailure(f"No answer from {arguments['url']!r} within {timeout} s.") from exc
    except httpx.HTTPError as exc:
        raise ToolFailure(f"Fetching {arguments['url']!r} failed: {type(exc).__name__}: {exc}") from exc
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    final_url = redirects[-1] if redirects else arguments["url"]
    observation: Observation = {
        "ok": response.status_code < 400,
        "url": final_url,
        "status": response.status_code,
        "content_type": content_type,
        "bytes": len(body),
        "truncated": truncated,
    }
    if redirects:
        observation["redirects"] = redirects
    if truncated:
        observation["_note"] = f"The body was cut at {max_bytes} bytes (max_bytes); use download_file for all of it."
    if response.status_code >= 400:
        observation["error"] = f"The server answered HTTP {response.status_code}."
    if content_type and not content_type.startswith(_TEXT_TYPES) and not content_type.endswith(("+json", "+xml")):
        observation["error"] = observation.get("error") or (
            f"The body is binary ({content_type}, {len(body)} bytes); use download_file to save it."
        )
        observation["ok"] = False
        return observation
    text = body.decode(response.encoding or "utf-8", errors="replace")
    wanted = arguments.get("format") or (
        "markdown" if content_type in ("text/html", "application/xhtml+xml") else "text"
    )
    if wanted == "markdown" and "html" in content_type:
        text = html_to_markdown(text)
    elif wanted == "json":
        try:
            observation["json"] = json.loads(text)
            observation["format"] = "json"
            return observation
        except json.JSONDecodeError as exc:
            observation.update(ok=False, error=f"The body is not valid JSON: {exc}")
    observation["format"] = wanted
    observation["content"] = text
    return observation


TOOLS = [builtin("fetch_url", fetch_url)]
