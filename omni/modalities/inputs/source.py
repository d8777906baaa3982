"""Where media bytes come from: data: URLs, base64 fields, and (opt-in) http(s) URLs.

Remote fetches are an SSRF surface, so every address a URL's host resolves to must be
public, checked at connect time by the resolver the connection actually uses (so a DNS answer
cannot change between the check and the connect), and redirects are followed by hand so each
hop is checked again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import re
import socket

import aiohttp
from aiohttp.abc import ResolveResult
from aiohttp.resolver import ThreadedResolver
from yarl import URL

from omni.shared.gil_free import join_bytes
from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits

_MAX_REDIRECTS = 5
_CHUNK_BYTES = 64 * 1024
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_SPACES = re.compile(r"\s*")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_public_address(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    # is_global also drops shared (CGNAT 100.64/10) and other special-purpose ranges that are
    # neither private nor reachable from the internet.
    return ip.is_global and not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def _check_address(address: str, url: str, param: str) -> None:
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    if not is_public_address(ip):
        raise MediaError(
            f"Refusing to fetch {url}: it resolves to the non-public address {ip}.", param=param
        )


class _PublicOnlyResolver(ThreadedResolver):
    def __init__(self, url: str, param: str) -> None:
        super().__init__()
        self._url = url
        self._param = param

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        hosts = await super().resolve(host, port, family)
        for h in hosts:
            _check_address(h["host"], self._url, self._param)
        return hosts


# base64 characters decoded per call (a multiple of 4): each call holds the GIL, about 1 ms here.
_BASE64_WINDOW = 256 * 1024
# Longer base64 text is decoded in a worker thread, so the event loop gets the GIL between windows.
DECODE_IN_THREAD_CHARS = 1 << 20


async def decode_base64_off_loop(data: str, limits: MediaLimits, param: str) -> bytes:
    if len(data) > DECODE_IN_THREAD_CHARS:
        return await asyncio.to_thread(decode_base64, data, limits, param)
    return decode_base64(data, limits, param)


def decode_base64(data: str, limits: MediaLimits, param: str, start: int = 0, end: int | None = None) -> bytes:
    """data[start:end], whitespace around it dropped, decoded as strict base64 (no whitespace or
    other characters inside, padding only at its end) a window at a time, without copying the
    text first: base64.b64decode(validate=True) of the whole, which also takes excess padding."""
    start, end = _strip(data, start, len(data) if end is None else end)
    # 4 base64 chars carry 3 bytes: refuse before allocating the decoded copy.
    if (end - start) // 4 * 3 > limits.max_bytes + 3:
        raise _too_large(limits, param)
    pieces = []
    try:
        for at in range(start, end, _BASE64_WINDOW):
            window = data[at : min(end, at + _BASE64_WINDOW)]
            if at + _BASE64_WINDOW < end and "=" in window:  # padding before the last window
                raise ValueError
            pieces.append(base64.b64decode(window, validate=True))
    except (binascii.Error, ValueError):
        raise MediaError(f"Invalid base64 data in {param}.", param=param) from None
    raw = join_bytes(pieces)  # the GIL released while it copies; one piece is returned as it is
    if len(raw) > limits.max_bytes:
        raise _too_large(limits, param)
    return raw


def _strip(data: str, start: int, end: int) -> tuple[int, int]:
    """data[start:end] without the whitespace around it, as (start, end): str.strip() would copy."""
    spaces = _SPACES.match(data, start, end)
    assert spaces is not None  # \s* matches everywhere
    start = spaces.end()
    while end > start:
        tail = data[max(start, end - 4096) : end]
        kept = tail.rstrip()
        end -= len(tail) - len(kept)
        if kept:
            break
    return start, end


def _parse_data_url(url: str, limits: MediaLimits, param: str) -> bytes:
    # data:<mime>[;<k>=<v>]*;base64,<payload>; the payload is decoded where it lies in url
    comma = url.find(",")
    parts = (url[len("data:") : comma] if comma >= 0 else "").split(";")
    if comma < 0 or "/" not in parts[0] or parts[-1].strip().lower() != "base64":
        raise MediaError(
            f"Malformed data URL in {param}: expected data:<mime type>;base64,<data>.",
            param=param,
        )
    return decode_base64(url, limits, param, comma + 1)


def _too_large(limits: MediaLimits, param: str) -> MediaError:
    return MediaError(
        f"Media in {param} is larger than the limit of {limits.max_bytes} bytes (max_bytes).",
        param=param,
    )


async def load_media_bytes(url: str, limits: MediaLimits, param: str) -> bytes:
    if url[:5].lower() == "data:":
        if len(url) > DECODE_IN_THREAD_CHARS:
            return await asyncio.to_thread(_parse_data_url, url, limits, param)
        return _parse_data_url(url, limits, param)
    scheme = url.partition(":")[0].lower()
    if scheme not in ("http", "https"):
        raise MediaError(
            f"Unsupported media URL in {param}: use a data: URL"
            + (" or an http(s) URL." if limits.allow_remote else "."),
            param=param,
        )
    if not limits.allow_remote:
        raise MediaError(
            f"Remote media URLs are disabled ({param}); send a data: URL, or start the "
            "server with --allow-remote-media.",
            param=param,
        )
    try:
        return await asyncio.wait_for(
            _fetch(url, limits, param), timeout=limits.remote_fetch_timeout_s
        )
    except asyncio.TimeoutError:
        raise MediaError(
            f"Fetching {url} for {param} took longer than {limits.remote_fetch_timeout_s} s.",
            param=param,
        ) from None


def _check_url(url: str, param: str) -> URL:
    try:
        parsed = URL(url)
    except ValueError:
        raise MediaError(f"Invalid media URL in {param}.", param=param) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise MediaError(f"Invalid media URL in {param}.", param=param)
    try:
        literal = ipaddress.ip_address(parsed.host)
    except ValueError:
        return parsed  # a host name: the resolver checks what it resolves to
    # aiohttp connects to a literal address without asking the resolver, so check it here.
    _check_address(str(literal), url, param)
    return parsed


async def _fetch(url: str, limits: MediaLimits, param: str) -> bytes:
    target = _check_url(url, param)
    connector = aiohttp.TCPConnector(resolver=_PublicOnlyResolver(url, param), use_dns_cache=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(_MAX_REDIRECTS + 1):
            try:
                async with session.get(target, allow_redirects=False) as resp:
                    if resp.status in _REDIRECT_STATUSES and "Location" in resp.headers:
                        target = _check_url(str(target.join(URL(resp.headers["Location"]))), param)
                        continue
                    if resp.status != 200:
                        raise MediaError(
                            f"Fetching {url} for {param} returned HTTP {resp.status}.",
                            param=param,
                        )
                    return await _read_capped(resp, limits, param)
            except aiohttp.ClientError as e:
                raise MediaError(f"Could not fetch {url} for {param}: {e}", param=param) from None
    raise MediaError(f"Too many redirects fetching {url} for {param}.", param=param)


async def _read_capped(resp: aiohttp.ClientResponse, limits: MediaLimits, param: str) -> bytes:
    if resp.content_length is not None and resp.content_length > limits.max_bytes:
        raise _too_large(limits, param)
    body = bytearray()
    # Content-Length may be absent or wrong (chunked encoding): count as we go.
    async for chunk in resp.content.iter_chunked(_CHUNK_BYTES):
        body += chunk
        if len(body) > limits.max_bytes:
            raise _too_large(limits, param)
    return bytes(body)
