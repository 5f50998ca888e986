"""A chat request's image parts, checked and decoded once, as the engine request's typed images.

Every API reaches here as a chat request: chat `image_url` parts, Responses `input_image` and Anthropic
`image` blocks are all translated to `ImageUrlPart`s of user messages. For a model without the `vision`
capability the first image part is a 400 naming the model, before any image is read. Otherwise each part
is loaded in order against one `ImageBudget` (count, bytes, format, dimensions: `gateway/serving/images.py`):
data URIs decoded in a thread (a 40-megapixel image must not stall the event loop), `http(s)` URLs
fetched by the gateway where the operator's allow-list admits them (`gateway/serving/image_urls.py`), refused
with a clear 400 otherwise. The worker gets the original bytes, never a URL.
"""

from __future__ import annotations

import asyncio

from backends.request import EngineImage, ImageMediaType
from gateway.config_images import ImageLimits
from gateway.errors import ErrorCode, GatewayError
from gateway.protocol.chat_messages import ImageUrlPart
from gateway.protocol.requests import ChatCompletionRequest
from gateway.serving.image_urls import RemoteImageFetcher
from gateway.serving.images import ImageBudget, ImageInput, load_data_uri


class ImageIntake:
    """The gateway's image policy: per-request limits and the remote URL fetcher. One per app."""

    def __init__(self, limits: ImageLimits | None = None, fetcher: RemoteImageFetcher | None = None) -> None:
        self.limits = limits or ImageLimits()
        self.fetcher = fetcher or RemoteImageFetcher(self.limits.remote)

    async def engine_images(self, parsed: object, *, model: str, vision: bool) -> tuple[EngineImage, ...]:
        """The request's images in the order of their markers in the engine request's text (none: ())."""
        if not isinstance(parsed, ChatCompletionRequest):
            return ()
        parts = image_parts(parsed)
        if not parts:
            return ()
        if not vision:
            raise GatewayError(
                ErrorCode.UNSUPPORTED_PARAMETER,
                f"model {model!r} does not accept images (capability vision is false for it)",
                param=parts[0][0],
            )
        budget = ImageBudget(self.limits)
        images: list[EngineImage] = []
        for param, part in parts:
            image = await self._load(part.image_url.url, budget, param)
            media_type: ImageMediaType = image.media_type  # type: ignore[assignment]  # one of the four formats
            images.append(EngineImage.of(media_type, image.data, image.digest))
        return tuple(images)

    async def _load(self, url: str, budget: ImageBudget, param: str) -> ImageInput:
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            return await asyncio.to_thread(load_data_uri, url, budget, param=param)
        if scheme in ("http", "https"):
            return await self.fetcher.load(url, budget, param=param)
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            "an image URL must be a data URI (data:image/png;base64,...) or, where allowed, an http(s) URL",
            param=param,
        )


def image_parts(parsed: ChatCompletionRequest) -> list[tuple[str, ImageUrlPart]]:
    """Every image part with the param that names it (`messages[i].content[j].image_url`), in order."""
    return [
        (f"messages[{i}].content[{j}].image_url", part)
        for i, message in enumerate(parsed.messages)
        for j, part in message.image_parts()
    ]
