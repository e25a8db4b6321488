"""Name -> function registries, so config strings pick algorithms and unknown names list the valid ones."""

from __future__ import annotations

from typing import Callable


class Registry:
    """`allowed`: the config's list of the key's names (rlcore.config.names), which the validator reads; a name
    outside it is refused at registration. None: users may register their own (custom_algorithms.path)."""

    def __init__(self, kind: str, config_key: str, allowed: tuple[str, ...] | None = None) -> None:
        self.kind = kind
        self.config_key = config_key
        self.allowed = allowed
        self._fns: dict[str, Callable] = {}

    def register(self, *names: str) -> Callable[[Callable], Callable]:
        def decorate(fn: Callable) -> Callable:
            for name in names:
                if self.allowed is not None and name not in self.allowed:
                    raise ValueError(f"{self.kind} '{name}' is not in the config's list of {self.config_key} names; add it to "
                                     "rlcore.config.names first (the validator reads that list)")
                if name in self._fns and self._fns[name] is not fn:
                    raise ValueError(f"{self.kind} '{name}' is already registered")
                self._fns[name] = fn
            return fn

        return decorate

    def get(self, name: str) -> Callable:
        if name not in self._fns:
            raise ValueError(f"unknown {self.kind} {self.config_key}={name!r}; valid: {', '.join(sorted(self._fns))}")
        return self._fns[name]

    def names(self) -> list[str]:
        return sorted(self._fns)

    def __contains__(self, name: str) -> bool:
        return name in self._fns
