"""Remote image URLs: refused unless the operator allows the host, then fetched by the gateway under limits.

The worker never fetches a URL; the gateway does, and only
- `http`/`https` URLs whose host is on the operator's allow-list (`images.remote.allow_hosts`);
- to addresses that are public: the host is resolved and every address it resolves to is checked (loopback,
  private, link-local, carrier-grade NAT, multicast, reserved and unspecified addresses are refused, IPv4
  inside IPv6 included), and the connection then goes to the address that was checked, never a second
  lookup (a DNS-rebinding host cannot swap in 127.0.0.1 between the check and the connect);
- within a size limit (Content-Length checked first, the body counted as it arrives) and one deadline for
  the whole fetch, redirects included; each redirect is checked again like the first URL.

A URL that passes becomes bytes, which gateway/serving/images.py then checks like any data URI.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urljoin, urlsplit

import httpx

from gateway.config_images import RemoteImageOptions
from gateway.errors import ErrorCode, GatewayError
from gateway.serving.images import ImageBudget, ImageInput, decode_image

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""(host, port) -> the addresses the host resolves to, as text."""

_REDIRECTS = {301, 302, 303, 307, 308}


def _invalid(message: str, param: str | None) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=param)


async def system_resolver(host: str, port: int) -> Sequence[str]:
    """Every address the system resolver gives for `host` (IPv4 and IPv6)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def public_address(text: str) -> IPAddress | None:
    """The address if a public server may be reached there, else None."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            address = mapped
    if not address.is_global or address.is_multicast:
        return None
    return address


def host_allowed(host: str, allow_hosts: Sequence[str]) -> bool:
    """`host` is on the list: exactly, or under a `*.example.com` entry (which does not match example.com)."""
    host = host.lower().rstrip(".")
    for entry in allow_hosts:
        entry = entry.lower().rstrip(".")
        if entry.startswith("*."):
            if host.endswith(entry[1:]):
                return True
        elif host == entry:
            return True
    return False


class RemoteImageFetcher:
    """Fetches allowed image URLs for the gateway. One per app; `transport` and `resolver` replace the network
    in tests (the transport then sees requests to the checked address, with the original Host header)."""

    def __init__(
        self,
        options: RemoteImageOptions,
        *,
        resolver: Resolver = system_resolver,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.options = options
        self._resolver = resolver
        self._transport = transport

    @property
    def enabled(self) -> bool:
        return bool(self.options.allow_hosts)

    async def load(self, url: str, budget: ImageBudget, *, param: str | None = None) -> ImageInput:
        """Fetch `url` (checked as the module says), then check the image and count it against `budget`."""
        budget.reserve(param=param)
        if not self.enabled:
            raise _invalid(
                "image URLs are not fetched by this gateway: send the image inline as a data URI"
                " (data:image/png;base64,...)",
                param,
            )
        max_bytes = min(self.options.max_bytes, budget.limits.max_image_bytes)
        try:
            async with asyncio.timeout(self.options.timeout_s):
                data = await self._fetch(url, max_bytes, param)
        except TimeoutError:
            raise _invalid(f"fetching the image URL took longer than {self.options.timeout_s:g} s", param) from None
        # The bytes decide the format: servers often label images loosely (a JPEG sent as image/png).
        image = await asyncio.to_thread(decode_image, data, None, budget.limits, param=param)  # CPU work
        return budget.add(image, param=param)

    async def _fetch(self, url: str, max_bytes: int, param: str | None) -> bytes:
        async with httpx.AsyncClient(transport=self._transport, follow_redirects=False, trust_env=False) as client:
            for _hop in range(self.options.max_redirects + 1):
                request = await self._pinned_request(client, url, param)
                response = await client.send(request, stream=True)
                try:
                    if response.status_code in _REDIRECTS and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise _invalid(f"fetching the image URL gave HTTP {response.status_code}", param)
                    return await _read_capped(response, max_bytes, param)
                finally:
                    await response.aclose()
        raise _invalid(f"the image URL redirected more than {self.options.max_redirects} times", param)

    async def _pinned_request(self, client: httpx.AsyncClient, url: str, param: str | None) -> httpx.Request:
        """A GET to the checked address of `url`'s host, carrying the host name for Host, SNI and the cert."""
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname
        if scheme not in ("http", "https") or not host:
            raise _invalid("an image URL must be a data URI or an http(s) URL", param)
        if parts.username or parts.password:
            raise _invalid("an image URL may not carry credentials", param)
        if not host_allowed(host, self.options.allow_hosts):
            raise _invalid(f"images from {host} are not allowed on this gateway", param)
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise _invalid("the image URL has an invalid port", param) from None
        address = await self._checked_address(host, port, param)
        target = httpx.URL(url).copy_with(host=str(address))
        headers = {
            "host": host if parts.port is None else f"{host}:{port}",
            "accept": "image/*",
            "accept-encoding": "identity",  # the size limit counts the bytes as sent
        }
        return client.build_request("GET", target, headers=headers, extensions={"sni_hostname": host})

    async def _checked_address(self, host: str, port: int, param: str | None) -> IPAddress:
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        try:
            found = [str(literal)] if literal is not None else list(await self._resolver(host, port))
        except OSError:
            raise _invalid(f"the image URL's host {host} does not resolve", param) from None
        if not found:
            raise _invalid(f"the image URL's host {host} does not resolve", param)
        checked: list[IPAddress] = []
        for text in found:
            address = public_address(text)
            if address is None:
                raise _invalid(
                    f"the image URL's host {host} resolves to {text}, a private, loopback or otherwise"
                    " non-public address: refused",
                    param,
                )
            checked.append(address)
        return checked[0]


async def _read_capped(response: httpx.Response, max_bytes: int, param: str | None) -> bytes:
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _invalid(f"the image at the URL is {declared} bytes, over the limit of {max_bytes}", param)
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > max_bytes:
            raise _invalid(f"the image at the URL is over the limit of {max_bytes} bytes", param)
    return bytes(body)
