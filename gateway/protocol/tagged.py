"""Building blocks of the translated APIs' wire types: lenient bodies, and tagged unions whose unknown members
are kept only to be refused by name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Discriminator


class Body(BaseModel):
    """A request object: unknown keys ignored (clients send extras), immutable once parsed."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Refused(BaseModel):
    """Anything recognised only to be refused by name (images, built-in or server tools, ...)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str


def type_tag(known: frozenset[str], default: str | None = None) -> Any:
    """A discriminator: the object's `type` when it is one we model, else "other" (a `Refused` member, whose
    `type: str` then refuses a `type` that is no string, an object or a list say, with a 400 naming it)."""

    def tag(value: Any) -> str:
        kind = value.get("type", default) if isinstance(value, dict) else getattr(value, "type", default)
        return kind if isinstance(kind, str) and kind in known else "other"

    return Discriminator(tag)
