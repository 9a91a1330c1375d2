"""The attribution target: which token's row a method explains, and which score it explains.

A run chooses one target (``RunConfig.target``, ``--target``), and every reader agrees on it:
rollout rows and HTA take the rows of the target position, gradient methods differentiate the
target score, and faithfulness follows the target class. Written like a method's parameters::

    position=first,score=predicted              (the default: every earlier number)
    position=last,score=contrastive,foil=0

- ``position``: ``first`` is the first token ([CLS] of BERT-style encoders, ``<s>`` of RoBERTa);
  ``last`` is each example's last real token (what decoder classifiers and next-token language
  models read; with right padding, position length - 1).
- ``score``: the logit of the ``predicted`` class (argmax on the full input), of the ``gold``
  class (the label; every example needs one), or ``contrastive``: the predicted class's logit
  minus a foil class's logit, the foil being ``foil=<class>`` or, by default, the runner-up.
  The target class (what faithfulness reads p(y | .) of) is the predicted class for
  ``predicted`` and ``contrastive``, the label for ``gold``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attrib_bench.core.errors import UsageError

POSITIONS = ("first", "last")
SCORES = ("predicted", "gold", "contrastive")


@dataclass(frozen=True)
class Target:
    """One run's attribution target; ``foil`` is None unless a contrastive foil is fixed."""

    position: str = "first"
    score: str = "predicted"
    foil: int | None = None

    @classmethod
    def parse(cls, text: str) -> Target:
        """``"position=last,score=gold"`` -> Target; a bad spec is a one-line UsageError."""
        values: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, eq, value = (part.strip() for part in item.partition("="))
            if not eq or key not in ("position", "score", "foil"):
                raise UsageError(
                    f"bad target item {item!r} in {text!r}; write "
                    "position=first|last,score=predicted|gold|contrastive[,foil=<class>]"
                )
            values[key] = value
        position = values.get("position", cls.position)
        score = values.get("score", cls.score)
        if position not in POSITIONS:
            raise UsageError(f"target position={position!r} is not one of {', '.join(POSITIONS)}")
        if score not in SCORES:
            raise UsageError(f"target score={score!r} is not one of {', '.join(SCORES)}")
        foil = None
        if "foil" in values:
            if score != "contrastive":
                raise UsageError(f"target foil= needs score=contrastive, got {text!r}")
            try:
                foil = int(values["foil"])
            except ValueError:
                raise UsageError(f"target foil must be a class index, got {text!r}") from None
            if foil < 0:
                raise UsageError(f"target foil must be a class index >= 0, got {foil}")
        return cls(position, score, foil)

    def __str__(self) -> str:
        foil = "" if self.foil is None else f",foil={self.foil}"
        return f"position={self.position},score={self.score}{foil}"

    def to_dict(self) -> dict[str, object]:
        return {
            "spec": str(self),
            "position": self.position,
            "score": self.score,
            "foil": self.foil,
        }

    def positions(self, mask_BN: torch.Tensor) -> torch.Tensor:
        """The target token of each example, (B,) long: 0, or its last real token."""
        if self.position == "first":
            return torch.zeros(mask_BN.shape[0], dtype=torch.long, device=mask_BN.device)
        real_BN = mask_BN.bool()
        index_N = torch.arange(mask_BN.shape[1], device=mask_BN.device)
        return torch.where(real_BN, index_N, -1).amax(dim=1)

    def classes(self, logits_BC: torch.Tensor, labels_B: torch.Tensor | None) -> torch.Tensor:
        """The class whose logit leads the score, (B,) long: predicted, or the label."""
        if self.score != "gold":
            return logits_BC.argmax(dim=-1)
        if labels_B is None:
            raise UsageError("target score=gold needs a label for every example; this has none")
        return labels_B.to(logits_BC.device)

    def foils(self, logits_BC: torch.Tensor) -> torch.Tensor | None:
        """The class subtracted by a contrastive score, (B,) long; None for the other scores."""
        if self.score != "contrastive":
            return None
        classes = logits_BC.shape[-1]
        if self.foil is not None:
            if self.foil >= classes:
                raise UsageError(f"target foil={self.foil}, but the model has {classes} classes")
            return torch.full(logits_BC.shape[:1], self.foil, device=logits_BC.device)
        if classes < 2:
            raise UsageError("target score=contrastive needs a model with at least two classes")
        return logits_BC.topk(2, dim=-1).indices[:, 1]


def target_score(
    logits_XC: torch.Tensor, classes_X: torch.Tensor, foils_X: torch.Tensor | None
) -> torch.Tensor:
    """The explained score per row, (X,): the class's logit, minus the foil's when given.

    The one definition gradient methods differentiate; rows may be repeated examples (the
    path steps of integrated gradients), each with its own class and foil.
    """
    score_X = logits_XC.gather(1, classes_X[:, None])[:, 0]
    if foils_X is None:
        return score_X
    return score_X - logits_XC.gather(1, foils_X[:, None])[:, 0]


DEFAULT_TARGET = Target()
