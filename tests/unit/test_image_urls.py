"""Remote image URLs (gateway/serving/image_urls.py): off by default; with an allow-list, fetched under limits and
never from a private, loopback or link-local address. No sockets: a fake resolver and httpx.MockTransport
stand in for DNS and the image server."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Sequence

import httpx
import pytest
from PIL import Image

from gateway.config_images import ImageLimits, RemoteImageOptions
from gateway.errors import GatewayError
from gateway.serving.image_urls import RemoteImageFetcher, host_allowed, public_address
from gateway.serving.images import ImageBudget

PUBLIC = "93.184.215.14"
PARAM = "messages[0].content[0].image_url.url"


def png(size: tuple[int, int] = (6, 4)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (9, 99, 199)).save(buf, format="PNG")
    return buf.getvalue()


class FakeResolver:
    """Stands for the system resolver: a fixed table of host -> addresses; counts lookups."""

    def __init__(self, table: dict[str, Sequence[str]]) -> None:
        self.table = table
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        if host not in self.table:
            raise OSError("name does not resolve")
        return self.table[host]


class FakeImageServer:
    """Stands for the remote server: answers from `routes` (path -> response) and records each request."""

    def __init__(self, routes: dict[str, httpx.Response], delay_s: float = 0.0) -> None:
        self.routes = routes
        self.delay_s = delay_s
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self.routes.get(request.url.path, httpx.Response(404))


def fetcher(
    server: FakeImageServer | None = None,
    table: dict[str, Sequence[str]] | None = None,
    **options: object,
) -> RemoteImageFetcher:
    opts = RemoteImageOptions.model_validate({"allow_hosts": ["img.example.com", "*.cdn.example.net"], **options})
    resolver = FakeResolver(
        table if table is not None else {"img.example.com": [PUBLIC], "a.cdn.example.net": [PUBLIC]}
    )
    server = server or FakeImageServer({"/cat.png": httpx.Response(200, content=png())})
    return RemoteImageFetcher(opts, resolver=resolver, transport=httpx.MockTransport(server))


async def refused(f: RemoteImageFetcher, url: str, limits: ImageLimits | None = None) -> str:
    with pytest.raises(GatewayError) as info:
        await f.load(url, ImageBudget(limits or ImageLimits()), param=PARAM)
    assert info.value.status == 400 and info.value.param == PARAM
    return info.value.message


async def test_urls_are_refused_by_default_with_what_to_send_instead() -> None:
    off = RemoteImageFetcher(RemoteImageOptions())
    message = await refused(off, "https://img.example.com/cat.png")
    assert message == (
        "image URLs are not fetched by this gateway: send the image inline as a data URI (data:image/png;base64,...)"
    )


async def test_an_allowed_url_is_fetched_from_the_checked_address_with_its_host_name() -> None:
    server = FakeImageServer({"/cat.png": httpx.Response(200, content=png(), headers={"content-type": "image/png"})})
    image = await fetcher(server).load("https://img.example.com/cat.png?x=1", ImageBudget(ImageLimits()))
    assert (image.format, image.width, image.height) == ("png", 6, 4)
    (request,) = server.requests
    assert request.url.host == PUBLIC  # pinned: no second lookup between the check and the connect
    assert request.url.query == b"x=1"
    assert request.headers["host"] == "img.example.com"
    assert request.extensions["sni_hostname"] == "img.example.com"
    assert request.headers["accept-encoding"] == "identity"


async def test_a_wildcard_entry_allows_subdomains_only() -> None:
    assert host_allowed("a.cdn.example.net", ["*.cdn.example.net"])
    assert host_allowed("A.CDN.example.net.", ["*.cdn.example.net"])
    assert not host_allowed("cdn.example.net", ["*.cdn.example.net"])
    assert not host_allowed("evilcdn.example.net", ["*.cdn.example.net"])
    assert not host_allowed("img.example.com.evil.org", ["img.example.com"])
    server = FakeImageServer({"/x.png": httpx.Response(200, content=png())})
    assert (await fetcher(server).load("http://a.cdn.example.net/x.png", ImageBudget(ImageLimits()))).width == 6


async def test_a_host_off_the_list_is_refused_without_a_lookup() -> None:
    f = fetcher()
    assert (
        await refused(f, "https://evil.example.org/cat.png")
        == "images from evil.example.org are not allowed on this gateway"
    )
    assert f._resolver.lookups == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.1",
        "192.168.1.20",
        "172.16.5.5",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "224.0.0.1",
        "2002:7f00:1::1",
    ],
)
async def test_a_literal_non_public_address_is_refused_even_when_allowed(address: str) -> None:
    host = f"[{address}]" if ":" in address else address
    server = FakeImageServer({"/a.png": httpx.Response(200, content=png())})
    f = fetcher(server, allow_hosts=[address])
    message = await refused(f, f"http://{host}/a.png")
    assert "non-public address: refused" in message
    assert server.requests == []


async def test_every_resolved_address_is_checked() -> None:
    server = FakeImageServer({"/cat.png": httpx.Response(200, content=png())})
    f = fetcher(server, table={"img.example.com": [PUBLIC, "10.0.0.7"]})
    message = await refused(f, "https://img.example.com/cat.png")
    assert message.startswith("the image URL's host img.example.com resolves to 10.0.0.7")
    assert server.requests == []


async def test_a_host_that_does_not_resolve_is_refused() -> None:
    f = fetcher(table={})
    assert (
        await refused(f, "https://img.example.com/cat.png") == "the image URL's host img.example.com does not resolve"
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file:///etc/passwd", "must be a data URI or an http(s) URL"),
        ("ftp://img.example.com/cat.png", "must be a data URI or an http(s) URL"),
        ("https://user:pw@img.example.com/cat.png", "may not carry credentials"),
        ("https://img.example.com:99999/cat.png", "invalid port"),
    ],
)
async def test_other_schemes_credentials_and_bad_ports_are_refused(url: str, message: str) -> None:
    assert message in await refused(fetcher(), url)


async def test_a_redirect_is_checked_again_and_one_to_a_private_address_refused() -> None:
    server = FakeImageServer(
        {
            "/moved.png": httpx.Response(302, headers={"location": "https://img.example.com/cat.png"}),
            "/sneaky.png": httpx.Response(302, headers={"location": "http://127.0.0.1/admin"}),
            "/cat.png": httpx.Response(200, content=png()),
        }
    )
    f = fetcher(server, allow_hosts=["img.example.com", "127.0.0.1"])
    assert (await f.load("https://img.example.com/moved.png", ImageBudget(ImageLimits()))).width == 6
    assert "127.0.0.1, a private, loopback" in await refused(f, "https://img.example.com/sneaky.png")
    assert all(r.url.host == PUBLIC for r in server.requests)


async def test_too_many_redirects_are_refused() -> None:
    server = FakeImageServer({"/loop.png": httpx.Response(301, headers={"location": "/loop.png"})})
    assert await refused(fetcher(server, max_redirects=2), "https://img.example.com/loop.png") == (
        "the image URL redirected more than 2 times"
    )
    assert len(server.requests) == 3


async def test_an_error_status_is_refused() -> None:
    assert await refused(fetcher(), "https://img.example.com/missing.png") == "fetching the image URL gave HTTP 404"


async def test_a_declared_length_over_the_limit_is_refused_before_the_body() -> None:
    server = FakeImageServer({"/big.png": httpx.Response(200, content=png(), headers={"content-length": "99999999"})})
    assert "99999999 bytes, over the limit of 1000" in await refused(
        fetcher(server, max_bytes=1000), "https://img.example.com/big.png"
    )


async def test_a_body_over_the_limit_is_cut_off() -> None:
    async def endless() -> object:
        while True:
            yield b"\x89PNG" + b"\0" * 4096

    server = FakeImageServer({"/stream.png": httpx.Response(200, content=endless())})
    message = await refused(fetcher(server, max_bytes=20_000), "https://img.example.com/stream.png")
    assert message == "the image at the URL is over the limit of 20000 bytes"


async def test_the_per_image_limit_applies_to_fetched_images_too() -> None:
    server = FakeImageServer({"/cat.png": httpx.Response(200, content=png((64, 64)))})
    limits = ImageLimits(max_image_bytes=100)
    assert "bytes, over the limit of 100" in await refused(fetcher(server), "https://img.example.com/cat.png", limits)


async def test_a_slow_server_is_cut_off_at_the_deadline() -> None:
    server = FakeImageServer({"/cat.png": httpx.Response(200, content=png())}, delay_s=5.0)
    message = await refused(fetcher(server, timeout_s=0.05), "https://img.example.com/cat.png")
    assert message == "fetching the image URL took longer than 0.05 s"


async def test_a_fetched_svg_or_broken_image_is_refused_like_a_data_uri() -> None:
    server = FakeImageServer(
        {
            "/a.svg": httpx.Response(200, content=b"<svg xmlns='http://www.w3.org/2000/svg'/>"),
            "/half.png": httpx.Response(200, content=png((50, 50))[:60]),
            "/cat.png": httpx.Response(200, content=png()),
        }
    )
    f = fetcher(server)
    assert "SVG images are not supported" in await refused(f, "https://img.example.com/a.svg")
    assert "truncated or corrupt" in await refused(f, "https://img.example.com/half.png")
    assert (await f.load("https://img.example.com/cat.png", ImageBudget(ImageLimits()))).width == 6


async def test_the_next_request_works_after_refusals() -> None:
    f = fetcher(allow_hosts=["img.example.com", "10.0.0.1"])
    await refused(f, "http://10.0.0.1/a.png")
    await refused(f, "https://img.example.com/missing.png")
    assert (await f.load("https://img.example.com/cat.png", ImageBudget(ImageLimits()))).height == 4


async def test_the_image_count_is_checked_before_fetching() -> None:
    server = FakeImageServer({"/cat.png": httpx.Response(200, content=png())})
    f = fetcher(server)
    budget = ImageBudget(ImageLimits(max_images=1))
    await f.load("https://img.example.com/cat.png", budget)
    with pytest.raises(GatewayError, match="at most 1 images"):
        await f.load("https://img.example.com/cat.png", budget)
    assert len(server.requests) == 1


def test_public_addresses() -> None:
    assert public_address("93.184.215.14") is not None
    assert public_address("2606:2800:220:1:248:1893:25c8:1946") is not None
    for text in ("127.0.0.1", "10.1.2.3", "fe80::1%eth0", "::ffff:192.168.0.1", "not an address"):
        assert public_address(text) is None
