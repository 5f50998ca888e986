"""Image inputs (gateway/serving/images.py): data URIs decoded and checked, limits, and every bad input a clear 400."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from gateway.config_images import ImageLimits
from gateway.errors import GatewayError
from gateway.serving import images
from gateway.serving.images import ImageBudget, decode_image, load_base64, load_data_uri, split_data_uri

LIMITS = ImageLimits()
PARAM = "messages[0].content[1].image_url.url"


def encoded(fmt: str, size: tuple[int, int] = (12, 8), colour: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format=fmt)
    return buf.getvalue()


def data_uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def refused(url: str, limits: ImageLimits = LIMITS) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        load_data_uri(url, ImageBudget(limits), param=PARAM)
    error = info.value
    assert error.status == 400 and error.code == "invalid_request_error" and error.param == PARAM
    return error


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (10, 10), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    return buf.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A real small PNG whose header (IHDR, with a valid checksum) claims other dimensions."""
    data = bytearray(encoded("PNG"))
    ihdr = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


SVG = b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>'


# --- what is accepted --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "media_type"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")]
)
def test_each_supported_format_is_accepted_with_its_size(fmt: str, media_type: str) -> None:
    image = load_data_uri(data_uri(encoded(fmt), media_type), ImageBudget(LIMITS))
    assert (image.media_type, image.width, image.height) == (media_type, 12, 8)
    assert image.data == encoded(fmt)  # the original bytes go on to the worker, not a re-encoding
    assert image.data_uri() == data_uri(encoded(fmt), media_type)


def test_an_animated_gif_is_accepted_and_its_first_frame_is_what_the_model_sees() -> None:
    image = load_data_uri(data_uri(animated_gif(), "image/gif"), ImageBudget(LIMITS))
    assert image.format == "gif"
    with Image.open(io.BytesIO(image.data)) as gif:
        assert gif.n_frames == 3
        assert gif.convert("RGB").getpixel((0, 0)) == (255, 0, 0)


def test_common_aliases_and_a_missing_media_type_are_accepted() -> None:
    jpeg = encoded("JPEG")
    assert load_data_uri(data_uri(jpeg, "image/jpg"), ImageBudget(LIMITS)).format == "jpeg"
    assert load_data_uri(data_uri(jpeg, "IMAGE/JPEG"), ImageBudget(LIMITS)).format == "jpeg"
    assert load_data_uri(f"data:;base64,{base64.b64encode(jpeg).decode()}", ImageBudget(LIMITS)).format == "jpeg"


def test_base64_wrapped_over_lines_and_without_padding_is_accepted() -> None:
    text = base64.b64encode(encoded("PNG", (5, 5))).decode().rstrip("=")
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    assert load_data_uri(f"data:image/png;base64,{wrapped}", ImageBudget(LIMITS)).width == 5


def test_an_anthropic_base64_source_is_checked_like_a_data_uri() -> None:
    png = encoded("PNG")
    assert load_base64("image/png", base64.b64encode(png).decode(), ImageBudget(LIMITS)).data == png
    with pytest.raises(GatewayError, match="declared image/jpeg but its bytes are image/png"):
        load_base64("image/jpeg", base64.b64encode(png).decode(), ImageBudget(LIMITS))


# --- the bad inputs: each a clear 400 ----------------------------------------------------------


def test_a_truncated_png_is_refused() -> None:
    png = encoded("PNG", (64, 64), (1, 2, 3))
    error = refused(data_uri(png[: len(png) // 2]))
    assert "image/png image is truncated or corrupt" in error.message


def test_a_png_with_a_broken_checksum_is_refused() -> None:
    png = bytearray(encoded("PNG"))
    idat = png.index(b"IDAT")
    png[idat + 4] ^= 0xFF  # the first byte of the compressed pixels: its chunk's CRC no longer matches
    assert "truncated or corrupt" in refused(data_uri(bytes(png))).message


def test_a_50_mb_image_is_refused_before_it_is_decoded(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decoding(*_args: object, **_kwargs: object) -> bytes:
        raise AssertionError("a 50 MB image must be refused before base64 decoding")

    monkeypatch.setattr(images.base64, "b64decode", no_decoding)
    url = "data:image/png;base64," + "A" * (50 * 1024 * 1024 * 4 // 3)
    error = refused(url)
    assert "about 50.0 MiB, over this gateway's limit of 20.0 MiB per image" in error.message


def test_decoded_bytes_over_the_limit_are_refused_before_parsing() -> None:
    with pytest.raises(GatewayError, match=r"the image is 2\.0 MiB, over this gateway.s limit of 1\.0 MiB"):
        decode_image(b"\x89PNG\r\n\x1a\n" + b"\0" * (2 * 1024 * 1024), "image/png", ImageLimits(max_image_bytes=2**20))


def test_an_svg_is_refused() -> None:
    assert refused(data_uri(SVG, "image/svg+xml")).message == (
        "SVG images are not supported: send PNG, JPEG, WebP or GIF"
    )
    assert "SVG" in refused(data_uri(SVG, "image/png")).message  # declared as a PNG: still an SVG
    assert "SVG" in refused(data_uri(b"\xef\xbb\xbf  <svg><circle/></svg>", "image/png")).message


def test_a_data_uri_with_a_wrong_media_type_is_refused() -> None:
    error = refused(data_uri(encoded("JPEG"), "image/png"))
    assert error.message == "the image is declared image/png but its bytes are image/jpeg"
    assert "image media type text/plain is not supported" in refused(data_uri(encoded("PNG"), "text/plain")).message
    assert "image/bmp is not supported" in refused(data_uri(encoded("BMP"), "image/bmp")).message


def test_bytes_of_no_supported_format_are_refused() -> None:
    assert "not PNG, JPEG, WebP or GIF" in refused(data_uri(encoded("BMP"), "image/png")).message
    assert "not PNG, JPEG, WebP or GIF" in refused(data_uri(b"hello world", "image/png")).message


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png;base64,@@@@", "invalid base64"),
        ("data:image/png;base64,", "empty"),
        ("data:image/png,rawbytes", "must be base64-encoded"),
        ("image/png;base64,AAAA", "not a data URI"),
    ],
)
def test_malformed_data_uris_are_refused(url: str, message: str) -> None:
    assert message in refused(url).message


def test_a_decompression_bomb_is_refused_from_its_header() -> None:
    # Pillow itself refuses to open a header this large: the same 400, without the dimensions
    assert "more than the 40000000 pixels this gateway decodes" in refused(data_uri(png_claiming(60000, 60000))).message
    error = refused(data_uri(png_claiming(9000, 20)))
    assert "9000x20 pixels; its sides may be at most 8192 pixels" in error.message
    error = refused(data_uri(png_claiming(8000, 8000)))
    assert "8000x8000 = 64000000 pixels, over the limit of 40000000" in error.message


def test_a_long_thin_image_is_refused_by_its_side() -> None:
    assert "9000x1 pixels" in refused(data_uri(encoded("PNG", (9000, 1)))).message


# --- counts and totals --------------------------------------------------------------------------------


def test_the_image_count_is_limited_before_the_next_image_is_read() -> None:
    budget = ImageBudget(ImageLimits(max_images=2))
    png = data_uri(encoded("PNG"))
    load_data_uri(png, budget)
    load_data_uri(png, budget)
    with pytest.raises(GatewayError, match="at most 2 images"):
        load_data_uri("data:image/png;base64,not even looked at", budget, param=PARAM)
    assert len(budget.images) == 2


def test_a_gateway_can_refuse_images_altogether() -> None:
    with pytest.raises(GatewayError, match="does not accept images"):
        load_data_uri(data_uri(encoded("PNG")), ImageBudget(ImageLimits(max_images=0)))


def test_the_total_bytes_of_a_requests_images_are_limited() -> None:
    png = encoded("PNG", (32, 32))
    budget = ImageBudget(ImageLimits(max_total_bytes=2 * len(png) + 1))
    load_data_uri(data_uri(png), budget)
    load_data_uri(data_uri(png), budget)
    with pytest.raises(GatewayError, match="images come to more than"):
        load_data_uri(data_uri(png), budget)
    assert budget.total_bytes == 2 * len(png)


def test_the_next_request_works_after_every_refusal() -> None:
    for bad in (data_uri(encoded("PNG")[:40]), data_uri(SVG, "image/svg+xml"), data_uri(encoded("JPEG"))):
        with pytest.raises(GatewayError):
            load_data_uri(bad, ImageBudget(LIMITS))
    assert load_data_uri(data_uri(encoded("PNG")), ImageBudget(LIMITS)).width == 12


def test_the_limits_refuse_unknown_keys_and_pillows_bomb_threshold() -> None:
    with pytest.raises(ValueError, match="extra"):
        ImageLimits.model_validate({"max_imgs": 3})
    with pytest.raises(ValueError, match="less than or equal"):
        ImageLimits(max_pixels=100_000_000)  # past Pillow's own bomb threshold: its warning would fire first


def test_the_declared_media_type_is_read_from_the_uri() -> None:
    declared, data = split_data_uri("data:image/PNG;charset=x;base64,AAAA", LIMITS)
    assert (declared, data) == ("image/png", b"\0\0\0")


# --- nothing but a 400, whatever the bytes ------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=512), st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp", None]))
def test_random_bytes_give_a_gateway_error_or_an_image(data: bytes, declared: str | None) -> None:
    try:
        decode_image(data, declared, LIMITS)
    except GatewayError as error:
        assert error.status == 400


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_every_truncation_of_a_real_image_gives_a_gateway_error_or_an_image(fmt: str) -> None:
    whole = encoded(fmt, (40, 30))
    for cut in range(0, len(whole), max(1, len(whole) // 60)):
        try:
            decode_image(whole[:cut], None, LIMITS)
        except GatewayError as error:
            assert error.status == 400
