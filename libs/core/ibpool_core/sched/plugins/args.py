"""Checking a plugin's `args` table from the profile config."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def numeric_args(args: Mapping[str, Any], defaults: Mapping[str, float]) -> dict[str, float]:
    """`defaults` overridden by `args`; ValueError for an unknown key or a value that is not a number."""
    unknown = sorted(set(args) - set(defaults))
    if unknown:
        raise ValueError(f"unknown args {', '.join(unknown)} (known: {', '.join(sorted(defaults)) or 'none'})")
    out = dict(defaults)
    for key, value in args.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"arg {key!r} must be a number, not {value!r}")
        out[key] = float(value)
    return out
