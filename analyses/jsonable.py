"""Analysis results as JSON: numpy scalars to Python numbers, NaN to null (JSON has no NaN)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def plain(v: Any) -> Any:
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return None if math.isnan(v) else float(v)
    return v


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A DataFrame's rows as plain dicts."""
    return [{k: plain(v) for k, v in row.items()} for row in df.to_dict("records")]
