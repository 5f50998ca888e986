"""A config file's validation errors as the lines a person reads: one per bad key, named as it was written."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

# A source is one of three shapes; pydantic reports a bad one against all three. The key the user wrote
# says which was meant, so only that member's errors are shown.
_SOURCE_KEYS = {"GGUFSource": "gguf", "HFSource": "hf", "RemoteSource": "remote"}


def format_validation_error(path: Path, exc: ValidationError, raw: object, renamed: dict[str, str]) -> str:
    """One line per bad key, `loc: message`: unknown keys as such, no pydantic prefixes or URLs, union
    members collapsed to the one the user meant, and no knock-on "too short" errors for a container whose
    item was already reported. `renamed` maps a top-level key to how to name it (set by an override)."""
    errors = [_source_error(err, raw) for err in exc.errors()]
    locs = [tuple(err["loc"]) for err in errors]
    lines, seen = [f"{path}: invalid configuration"], set()
    for err, loc in zip(errors, locs, strict=True):
        if err["type"] == "other_member":
            continue
        if err["type"] == "too_short" and any(other[: len(loc)] == loc and other != loc for other in locs):
            continue
        names = [str(p) for p in loc]
        if names:
            names[0] = renamed.get(names[0], names[0])
        msg = "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"]).removeprefix("Value error, ")
        line = f"  {'.'.join(names) or '(top level)'}: {msg}"
        if line not in seen:
            seen.add(line)
            lines.append(line)
    return "\n".join(lines)


def _source_error(err: ErrorDetails, raw: object) -> ErrorDetails:
    """An error inside a union of sources, rewritten for the member the user meant (or for none)."""
    loc = tuple(err["loc"])
    at = next((i for i, part in enumerate(loc) if part in _SOURCE_KEYS), None)
    if at is None:
        return err
    value: object = raw
    for part in loc[:at]:
        try:
            value = value[part]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            return err
    keys = set(value) if isinstance(value, dict) else set()
    meant = next((name for name, key in _SOURCE_KEYS.items() if key in keys), None)
    if meant is None:
        got = f" (got: {', '.join(sorted(map(str, keys)))})" if keys else ""
        msg = f"a source needs one of the keys gguf, hf or remote{got}"
        return ErrorDetails(type="source_kind", loc=loc[:at], msg=msg, input=value)
    if loc[at] != meant:
        return ErrorDetails(type="other_member", loc=loc[:at], msg="", input=value)
    return ErrorDetails(type=err["type"], loc=loc[:at] + loc[at + 1 :], msg=err["msg"], input=err["input"])
