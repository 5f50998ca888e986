"""Identifiers minted by the translated APIs: `resp_…`, `msg_…`, `fc_…`, `call_…`."""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    """A fresh id such as `resp_3f2a…` (32 hex digits after the prefix)."""
    return f"{prefix}_{uuid.uuid4().hex}"
