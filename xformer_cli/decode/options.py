"""How to decode: a model's decode defaults plus what one translation run chooses."""

from __future__ import annotations

import functools
import math
import typing
from dataclasses import asdict, dataclass
from typing import Any, Optional

from xformer_cli.config import SEED_LIMIT, DecodeConfig
from xformer_cli.errors import XformerError


@dataclass
class SearchOptions(DecodeConfig):
    """The checkpoint's decode config (an engine's ``options`` fills what is not given from
    it) plus what only a translation run chooses."""

    nbest: int = 1
    sampling_topk: int = 0  # 0: search; k > 0 sample from the k best; -1 from all (beam must be 1)
    temperature: float = 1.0
    seed: Optional[int] = None
    use_cache: bool = True
    # A multilingual model's target language (its tag leads every source line); None: the
    # model's one target, or the tag each line starts with (">>fra<< A man ...").
    target_lang: Optional[str] = None
    # Whether length_penalty was asked for, or is the model's default for the target: options made
    # again for another target (text/translation.py) then take that target's own alpha.
    length_penalty_given: bool = False

    def problems(self) -> list[tuple[str, str]]:
        found = super().problems()
        if not 1 <= self.nbest <= max(self.beam_size, 1):
            found.append(("nbest", f"must be between 1 and the beam size ({self.beam_size}), got {self.nbest}"))
        if self.sampling_topk and self.beam_size != 1:
            found.append(("sampling_topk", "sampling draws one translation per sentence: use it with --beam-size 1"))
        if not 0 < self.temperature < math.inf:  # nan too: sampling from nan probabilities fails deep in torch
            found.append(("temperature", f"must be positive and finite, got {self.temperature}"))
        if self.sampling_topk < -1:
            found.append(("sampling_topk", f"must be k > 0 (the k best), -1 (all) or 0 (search), "
                                           f"got {self.sampling_topk}"))
        if self.seed is not None and not 0 <= self.seed < SEED_LIMIT:
            found.append(("seed", f"must be 0 to {SEED_LIMIT - 1}, got {self.seed}"))
        if self.sampling_topk == 0:  # search draws nothing: these would be ignored without a word
            if self.temperature != 1.0:
                found.append(("temperature",
                              "sets how sampling draws: use it with --sampling-topk (and --beam-size 1)"))
            if self.seed is not None:
                found.append(("seed", "seeds sampling's draws: use it with --sampling-topk (and --beam-size 1)"))
        return found

    def check(self) -> "SearchOptions":
        """Itself, or a one-line error naming the first bad option as its flag."""
        for name, why in self.problems():
            raise XformerError(f"--{name.replace('_', '-')}: {why}")
        return self


def resolve_options(decode: DecodeConfig, **given: Any) -> SearchOptions:
    """``given`` options (None = unset) over a model's decode defaults, checked."""
    unknown = sorted(set(given) - set(SearchOptions.__dataclass_fields__))
    if unknown:
        raise XformerError(f"unknown decoding option(s): {', '.join(unknown)}")
    given = {k: v for k, v in given.items() if v is not None}
    for name, value in given.items():
        _check_type(name, value)
    return SearchOptions(**{**asdict(decode), **given}).check()


@functools.cache
def _option_types() -> dict[str, Any]:
    """SearchOptions' field types, evaluated once (options are made for every served request)."""
    return typing.get_type_hints(SearchOptions)


def _check_type(name: str, value: Any) -> None:
    """A Python caller's option of the wrong type (beam_size="4", 2.5) is refused by name here,
    not met deep in the search as a comparison or a tensor size that fails."""
    wanted = _option_types()[name]
    if typing.get_origin(wanted) is typing.Union:  # Optional[X]: X
        wanted = next(t for t in typing.get_args(wanted) if t is not type(None))
    base = typing.get_origin(wanted) or wanted
    if base is float:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif base is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    else:
        fits = isinstance(value, base)
    if not fits:
        raise XformerError(f"decoding option {name} must be {getattr(wanted, '__name__', str(wanted))}, "
                           f"got {value!r}")
