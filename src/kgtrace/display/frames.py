"""Result tables as data frames for a notebook: polars as kgtrace keeps them, or pandas when asked.

polars' own ``to_pandas`` needs pyarrow, which kgtrace does not install; a pandas frame is built here
from the columns instead, so that ``result.to_df("pandas")`` works wherever pandas does.
"""

from __future__ import annotations

from typing import Any, Literal

import polars as pl

from kgtrace.core.errors import KgtraceError

__all__ = ["FrameKind", "as_frame"]

FrameKind = Literal["polars", "pandas"]


def as_frame(table: pl.DataFrame, kind: FrameKind = "polars") -> Any:
    """``table`` as a polars DataFrame (itself), or as a pandas one (columns copied; no pyarrow needed)."""
    if kind == "polars":
        return table
    if kind != "pandas":
        raise KgtraceError(f"kind={kind!r}: a data frame is 'polars' or 'pandas'")
    try:
        import pandas as pd  # optional: only this form of the result needs it
    except ImportError:
        raise KgtraceError("kind='pandas' needs pandas, which is not installed. Fix: pip install pandas, or use the "
                           "polars frame (kind='polars')") from None
    return pd.DataFrame({name: table[name].to_list() for name in table.columns}, columns=table.columns)
