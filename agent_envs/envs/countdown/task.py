"""The Countdown task model (validated at the loader boundary)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt


class CountdownTask(BaseModel):
    """One instance: combine every number of ``nums`` exactly once to reach ``target``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    nums: tuple[Annotated[StrictInt, Field(ge=0)], ...] = Field(min_length=2, max_length=6)
    target: StrictInt

    def fill(self, template: str) -> str:
        """``template`` with ``{nums}`` and ``{target}`` replaced (``str.replace``: other braces stay)."""
        return template.replace("{nums}", ", ".join(map(str, self.nums))).replace("{target}", str(self.target))
