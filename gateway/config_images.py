"""The config's `images` section: per-request image limits and the remote image fetch policy
(`gateway.serving.images` and `gateway.serving.image_urls` enforce them)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_MiB = 1024 * 1024


class RemoteImageOptions(BaseModel):
    """Fetching `http(s)` image URLs (`gateway.serving.image_urls`). Off unless `allow_hosts` names a host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_hosts: tuple[str, ...] = Field(
        default=(), description="hosts images may come from: `images.example.com` or `*.example.com`; empty: none"
    )
    max_bytes: int = Field(default=10 * _MiB, ge=1, description="a larger response is cut off and refused")
    timeout_s: float = Field(default=10.0, gt=0, description="the whole fetch, redirects and body included")
    max_redirects: int = Field(default=3, ge=0, description="each hop is checked again like the first URL")


class ImageLimits(BaseModel):
    """Per-request image limits (config key `images`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_images: int = Field(default=16, ge=0, description="image parts in one request")
    max_image_bytes: int = Field(default=20 * _MiB, ge=1, description="one encoded image (after base64)")
    max_total_bytes: int = Field(default=48 * _MiB, ge=1, description="all images of one request together")
    max_side_px: int = Field(default=8192, ge=1, description="width or height")
    max_pixels: int = Field(default=40_000_000, ge=1, le=80_000_000, description="width times height")
    remote: RemoteImageOptions = RemoteImageOptions()
