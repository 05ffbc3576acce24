"""Per-sample engine statistics with slime's names and behaviour: speculative decoding acceptance and
prefix cache hits, accumulated from SGLang's ``meta_info`` (``Sample.spec_info``, ``Sample.prefix_cache_info``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

_SPEC_META_KEYS = {
    "spec_accept_token_num": "spec_accept_token_num",
    "spec_draft_token_num": "spec_draft_token_num",
    "spec_verify_ct": "spec_verify_ct",
    "completion_token_num": "completion_tokens",
}


class _Counters:
    """Integer counters that round-trip through plain dicts (missing keys are 0)."""

    __slots__: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Any:
        data = data or {}
        return cls(**{f.name: data.get(f.name, 0) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


@dataclass(slots=True)
class SpecInfo(_Counters):
    """Speculative decoding: accepted and drafted tokens, verification rounds, completion tokens."""

    spec_accept_token_num: int = 0
    spec_draft_token_num: int = 0
    spec_verify_ct: int = 0
    completion_token_num: int = 0

    @property
    def spec_accept_rate(self) -> float:
        return (
            self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num > 0 else 0.0
        )

    @property
    def spec_accept_length(self) -> float:
        return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0

    def add(self, meta_info: dict[str, Any]) -> None:
        for name, key in _SPEC_META_KEYS.items():
            setattr(self, name, getattr(self, name) + meta_info.get(key, 0))


@dataclass(slots=True)
class PrefixCacheInfo(_Counters):
    """Prefix cache: prompt tokens served from the cache out of all prompt tokens."""

    cached_tokens: int = 0
    total_prompt_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens > 0 else 0.0

    def add(self, meta_info: dict[str, Any]) -> None:
        self.cached_tokens += meta_info.get("cached_tokens", 0)
        self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)
