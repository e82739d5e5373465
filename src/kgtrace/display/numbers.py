"""Numbers as people read them, in the console and in the report alike."""

from __future__ import annotations


def rank_number(value: object) -> str:
    """A rank as read: whole ranks as integers (12,345), a tie's half rank with one decimal (3.5); anything else
    (a rank not computed) as its text."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return str(value)
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"
