"""Optional base class for plugins that take ``name:key=value`` parameters."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from attrib_bench.core.errors import UsageError


def parse_value(raw: str, default: Any) -> Any:
    """Convert a parameter written on the command line to the type of its default."""
    if isinstance(default, bool):
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected true or false, got {raw!r}")
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return raw


class Configurable:
    """Gives a plugin a ``parameters`` table of defaults and a validated ``configure``.

    ``configure`` returns a configured copy, so one registered object serves several specs
    (``rollout`` and ``rollout:residual=0.9`` in the same run).
    """

    name: str
    #: Parameter names and their defaults; the default's type is the parameter's type.
    parameters: ClassVar[Mapping[str, Any]] = {}
    #: Allowed values for string parameters, where the set is closed.
    choices: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def __init__(self) -> None:
        self.params: dict[str, Any] = dict(self.parameters)

    def configure(self, raw: Mapping[str, str]) -> Configurable:
        configured = copy.copy(self)
        configured.params = dict(self.params)
        for key, value in raw.items():
            if key not in self.parameters:
                valid = ", ".join(sorted(self.parameters)) or "(none)"
                raise UsageError(
                    f"unknown parameter {key!r} for {self.name!r}; valid parameters: {valid}"
                )
            try:
                parsed = parse_value(value, self.parameters[key])
            except ValueError as error:
                raise UsageError(f"bad value for {self.name}:{key}: {error}") from None
            allowed = self.choices.get(key)
            if allowed is not None and parsed not in allowed:
                raise UsageError(
                    f"bad value {parsed!r} for {self.name}:{key}; valid choices: "
                    + ", ".join(allowed)
                )
            configured.params[key] = parsed
        configured.validate()
        return configured

    def validate(self) -> None:
        """Check parameter ranges; raise UsageError. Override where ranges matter."""

    def out_of_range(self, key: str, requirement: str) -> UsageError:
        """The error for ``key`` outside its range, for ``validate`` to raise.

        It names the offending value alone: the whole parameter table buries the one number the
        user got wrong.
        """
        return UsageError(f"{self.name}:{key} must be {requirement}, got {self.params[key]!r}")
