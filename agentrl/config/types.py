"""Field types and the section base shared by every config module.

Strict numbers and booleans: YAML already yields real ints, floats and bools, so a value such as
``group_size: true`` is a mistake we report rather than coerce (see ``config/schema.py``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

# Reusable strict field types. ``allow_inf_nan=False``: a NaN learning rate is never intended.
NonNegInt = Annotated[int, Strict(), Field(ge=0)]
PosInt = Annotated[int, Strict(), Field(ge=1)]
NonNegFloat = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
PosFloat = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
Fraction = Annotated[float, Strict(), Field(gt=0, le=1, allow_inf_nan=False)]  # (0, 1]
OpenUnit = Annotated[float, Strict(), Field(gt=0, lt=1, allow_inf_nan=False)]  # (0, 1)
Beta = Annotated[float, Strict(), Field(ge=0, lt=1, allow_inf_nan=False)]  # [0, 1)
Unit = Annotated[float, Strict(), Field(ge=0, le=1, allow_inf_nan=False)]  # [0, 1]
Bool = Annotated[bool, Strict()]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors; assignments are re-validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)
