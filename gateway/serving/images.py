"""Image inputs: data URIs decoded and checked, per-image and per-request limits, before anything reaches a worker.

An image part's URL is one of
- a data URI (`data:image/png;base64,...`): PNG, JPEG, WebP or GIF (its first frame is what the model sees);
- an `http(s)` URL: refused unless the operator allows its host (gateway/serving/image_urls.py fetches it then,
  the worker never does).

Every check happens in an order that keeps hostile input cheap: the encoded size before base64 is decoded,
the decoded size before the image is parsed, the format sniffed from the bytes (never trusted from the
media type, which must agree with them), the pixel dimensions from the header before the pixels are
decoded (a decompression bomb is refused there), then the whole image decoded once so a truncated or
corrupt file is a 400 here and never a crash in the encoder. Every refusal is a GatewayError 400 naming
the request field it came from.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from dataclasses import dataclass, field
from typing import Literal

from PIL import Image, UnidentifiedImageError

from gateway.config_images import ImageLimits
from gateway.errors import ErrorCode, GatewayError

ImageFormat = Literal["png", "jpeg", "webp", "gif"]

MEDIA_TYPES: dict[ImageFormat, str] = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
    "gif": "image/gif",
}
_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}
_PILLOW_FORMATS: dict[ImageFormat, str] = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP", "gif": "GIF"}
_DATA_URI = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[^;,]*)*)(?P<b64>;base64)?,", re.I)
_MiB = 1024 * 1024


@dataclass(frozen=True)
class ImageInput:
    """A checked image: its original bytes (what the worker decodes), their format, size and content hash."""

    format: ImageFormat
    width: int
    height: int
    data: bytes = field(repr=False)

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def data_uri(self) -> str:
        return f"data:{self.media_type};base64,{base64.b64encode(self.data).decode('ascii')}"


_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def _invalid(message: str, param: str | None) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=param)


def _size(n: int) -> str:
    return f"{n / _MiB:.1f} MiB" if n >= _MiB else f"{n} bytes"


def split_data_uri(url: str, limits: ImageLimits, *, param: str | None = None) -> tuple[str | None, bytes]:
    """The declared media type (None if the URI names none) and the decoded bytes of a base64 data URI.

    The size is checked on the encoded text first: an oversized image is refused without decoding it.
    """
    match = _DATA_URI.match(url)
    if match is None:
        raise _invalid("the image URL is not a data URI of the form data:image/png;base64,<data>", param)
    if not match.group("b64"):
        raise _invalid("an image data URI must be base64-encoded (data:image/png;base64,<data>)", param)
    payload = url[match.end() :]
    estimate = len(payload) * 3 // 4
    if estimate > limits.max_image_bytes:
        raise _invalid(
            f"the image is about {_size(estimate)}, over this gateway's limit of {_size(limits.max_image_bytes)}"
            " per image",
            param,
        )
    compact = re.sub(r"\s+", "", payload)
    try:
        data = base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise _invalid("the image data URI holds invalid base64", param) from None
    if not data:
        raise _invalid("the image data URI is empty", param)
    declared = match.group("type")
    return (declared.lower() if declared else None), data


def sniff_format(data: bytes) -> ImageFormat | None:
    """The image format the bytes start with, or None for anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def _looks_like_svg(data: bytes, declared: str | None) -> bool:
    if declared == "image/svg+xml":
        return True
    head = data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith((b"<?xml", b"<svg", b"<!doctype svg")) and b"<svg" in data[:4096].lower()


def decode_image(data: bytes, declared: str | None, limits: ImageLimits, *, param: str | None = None) -> ImageInput:
    """Check an encoded image end to end (format, media type, dimensions, integrity); returns it checked."""
    if len(data) > limits.max_image_bytes:
        raise _invalid(
            f"the image is {_size(len(data))}, over this gateway's limit of {_size(limits.max_image_bytes)} per image",
            param,
        )
    if _looks_like_svg(data, declared):
        raise _invalid("SVG images are not supported: send PNG, JPEG, WebP or GIF", param)
    if declared is not None:
        declared = _ALIASES.get(declared, declared)
        if declared not in MEDIA_TYPES.values():
            raise _invalid(f"image media type {declared} is not supported: use PNG, JPEG, WebP or GIF", param)
    fmt = sniff_format(data)
    if fmt is None:
        raise _invalid("the image is not PNG, JPEG, WebP or GIF (its bytes match none of them)", param)
    if declared is not None and declared != MEDIA_TYPES[fmt]:
        raise _invalid(f"the image is declared {declared} but its bytes are {MEDIA_TYPES[fmt]}", param)
    width, height = _checked_pixels(data, fmt, limits, param)
    return ImageInput(fmt, width, height, data)


def _checked_pixels(data: bytes, fmt: ImageFormat, limits: ImageLimits, param: str | None) -> tuple[int, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[fmt]]) as header:
                width, height = header.size  # the header only: no pixel decoded yet
                _check_dimensions(width, height, limits, param)
                header.verify()  # chunk checksums (PNG) and structure, without decoding
            with Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[fmt]]) as image:
                image.load()  # the first frame, in full: a truncated file fails here
        except GatewayError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise _invalid(
                f"the image has more than the {limits.max_pixels} pixels this gateway decodes", param
            ) from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, IndexError) as exc:
            reason = _OBJECT_REPR.sub("the image", str(exc))  # Pillow names its file object: no address leaks
            raise _invalid(f"the {MEDIA_TYPES[fmt]} image is truncated or corrupt ({reason})", param) from None
    return width, height


def _check_dimensions(width: int, height: int, limits: ImageLimits, param: str | None) -> None:
    if width < 1 or height < 1:
        raise _invalid(f"the image is {width}x{height} pixels: it has no pixels", param)
    if max(width, height) > limits.max_side_px:
        raise _invalid(
            f"the image is {width}x{height} pixels; its sides may be at most {limits.max_side_px} pixels", param
        )
    if width * height > limits.max_pixels:
        raise _invalid(
            f"the image is {width}x{height} = {width * height} pixels, over the limit of {limits.max_pixels}", param
        )


class ImageBudget:
    """One request's image allowance: counts images and their bytes as they are added. Not thread-safe."""

    def __init__(self, limits: ImageLimits) -> None:
        self.limits = limits
        self.images: list[ImageInput] = []
        self.total_bytes = 0

    def reserve(self, *, param: str | None = None) -> None:
        """Call before loading an image: refuses one past `max_images` before any byte of it is read."""
        if len(self.images) >= self.limits.max_images:
            if self.limits.max_images == 0:
                raise _invalid("this gateway does not accept images", param)
            raise _invalid(f"a request may hold at most {self.limits.max_images} images", param)

    def add(self, image: ImageInput, *, param: str | None = None) -> ImageInput:
        self.reserve(param=param)
        if self.total_bytes + len(image.data) > self.limits.max_total_bytes:
            raise _invalid(
                f"the request's images come to more than {_size(self.limits.max_total_bytes)} together", param
            )
        self.images.append(image)
        self.total_bytes += len(image.data)
        return image


def load_data_uri(url: str, budget: ImageBudget, *, param: str | None = None) -> ImageInput:
    """A data URI image, checked and counted against the request's budget."""
    budget.reserve(param=param)
    declared, data = split_data_uri(url, budget.limits, param=param)
    return budget.add(decode_image(data, declared, budget.limits, param=param), param=param)


def load_base64(media_type: str, data_b64: str, budget: ImageBudget, *, param: str | None = None) -> ImageInput:
    """Anthropic's `{"type": "base64", "media_type": ..., "data": ...}` image source, like a data URI."""
    return load_data_uri(f"data:{media_type};base64,{data_b64}", budget, param=param)
