"""The attribution target: which token's row a method explains, and which score it explains.

A run chooses one target (``RunConfig.target``, ``--target``), and every reader agrees on it:
rollout rows and HTA take the rows of the target position, gradient methods differentiate the
target score, and faithfulness reads it too. Written like a method's parameters::

    position=auto,score=predicted               (the default)
    position=last,score=contrastive,foil=0
    position=last,score=contrastive,class=gold,foil=example

- ``position``: ``first`` is the first token ([CLS] of BERT-style encoders, ``<s>`` of RoBERTa);
  ``last`` is each example's last real token (what decoder classifiers and next-token language
  models read; with right padding, position length - 1); ``auto`` (the default) is the model
  family's own (``ArchitectureSpec.target_position``; ``first`` for a model without a spec),
  resolved once the model is loaded: the trace, the result and the cache see only the resolved
  position, so a default run on BERT is ``position=first,score=predicted`` as before.
- ``score``: the logit of the ``predicted`` class (argmax on the full input), of the ``gold``
  class (the label; every example needs one), or ``contrastive``: the logit of ``class``
  (``predicted``, the default, or ``gold``) minus a foil's logit. The foil is a fixed class
  index (``foil=<k>``), the ``runner-up`` (the default: the highest-scoring class other than
  ``class``), or ``example``: each example's own ``Example.foil``.

Classes are indices into the last dimension of the logits, so a language model's token ids
work as well as a classifier's labels. A foil equal to an example's gold class is a one-line
UsageError (a data error: its score would be 0, explaining nothing), as are a gold class
without labels and ``foil=example`` without ``Example.foil``: over all examples up front
(``check_examples``), and per batch for examples built in Python. A foil that is an example's
predicted class gives it a score of 0: the model's choice, not an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from attrib_bench.core.errors import UsageError

if TYPE_CHECKING:  # torch loads with the first tensor: the CLI parses --target before it
    import torch

    from attrib_bench.core.batch import Example

POSITIONS = ("auto", "first", "last")
#: What ``position=auto`` may resolve to (an ``ArchitectureSpec.target_position``).
FAMILY_POSITIONS = ("first", "last")
SCORES = ("predicted", "gold", "contrastive")
CLASSES = ("predicted", "gold")
#: The named foils; any other foil is a class index.
FOILS = ("runner-up", "example")
SYNTAX = (
    "position=auto|first|last,score=predicted|gold|contrastive"
    "[,class=predicted|gold][,foil=<class>|runner-up|example]"
)


@dataclass(frozen=True)
class Target:
    """One run's attribution target.

    ``foil`` is None for the runner-up (and for non-contrastive scores), a class index, or
    ``"example"``; ``class_`` is the class a contrastive score leads with.
    """

    position: str = "auto"
    score: str = "predicted"
    foil: int | str | None = None
    class_: str = "predicted"

    def __post_init__(self) -> None:
        if self.position not in POSITIONS:
            raise UsageError(
                f"target position={self.position!r} is not one of {', '.join(POSITIONS)}"
            )
        if self.score not in SCORES:
            raise UsageError(f"target score={self.score!r} is not one of {', '.join(SCORES)}")
        if self.class_ not in CLASSES:
            raise UsageError(f"target class={self.class_!r} is not one of {', '.join(CLASSES)}")
        if self.score != "contrastive" and (self.foil is not None or self.class_ != "predicted"):
            raise UsageError(
                f"target class= and foil= need score=contrastive, got score={self.score}"
            )
        if isinstance(self.foil, str) and self.foil != "example":
            raise UsageError(
                f"target foil={self.foil!r}: write a class index, runner-up or example"
            )
        if isinstance(self.foil, int) and self.foil < 0:
            raise UsageError(f"target foil must be a class index >= 0, got {self.foil}")

    @classmethod
    def parse(cls, text: str) -> Target:
        """``"position=last,score=gold"`` -> Target; a bad spec is a one-line UsageError.

        An empty spec and a repeated key are refused rather than read as the default and as
        the last value: either is more likely a slip than the run the user meant. Keys left
        out keep their defaults, and the spec is written back in one order:

        >>> str(Target.parse("score=gold,position=last"))
        'position=last,score=gold'
        >>> Target.parse("score=contrastive").to_dict()["class"]  # the default class
        'predicted'
        """
        values: dict[str, str] = {}
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise UsageError(
                f"empty target {text!r}; leave it out for the default, or write {SYNTAX}"
            )
        for item in items:
            key, eq, value = (part.strip() for part in item.partition("="))
            if not eq or key not in ("position", "score", "class", "foil"):
                raise UsageError(f"bad target item {item!r} in {text!r}; write {SYNTAX}")
            if key in values:
                raise UsageError(f"target {key}= given twice in {text!r}; give each key once")
            values[key] = value
        score = values.get("score", cls.score)
        if score != "contrastive" and ("class" in values or "foil" in values):
            given = ", ".join(f"{key}=" for key in ("class", "foil") if key in values)
            raise UsageError(f"target {given} needs score=contrastive, got {text!r}")
        foil: int | str | None = values.get("foil")
        if foil == "runner-up":
            foil = None
        elif foil is not None and foil not in FOILS:
            try:
                foil = int(foil)
            except ValueError:
                raise UsageError(
                    f"target foil must be a class index, runner-up or example, got {text!r}"
                ) from None
        return cls(
            values.get("position", cls.position),
            score,
            foil,
            values.get("class", cls.class_),
        )

    def __str__(self) -> str:
        leading = ",class=gold" if self.class_ == "gold" else ""
        foil = "" if self.foil is None else f",foil={self.foil}"
        return f"position={self.position},score={self.score}{leading}{foil}"

    @property
    def leading(self) -> str:
        """Whose logit the score leads with: ``predicted`` or ``gold``, for every score."""
        return "gold" if self.score == "gold" else self.class_

    def to_dict(self) -> dict[str, object]:
        return {
            "spec": str(self),
            "position": self.position,
            "score": self.score,
            "class": self.leading,
            "foil": self.foil,
        }

    def resolved(self, family_position: str) -> Target:
        """This target with ``position=auto`` replaced by the model family's default."""
        if self.position != "auto":
            return self
        if family_position not in FAMILY_POSITIONS:
            raise UsageError(
                f"the model family's target_position={family_position!r} is not one of "
                + ", ".join(FAMILY_POSITIONS)
            )
        return replace(self, position=family_position)

    def check_examples(self, examples: Sequence[Example]) -> None:
        """The checks the data alone decides, over all examples at once: labels for a gold
        class, foils for ``foil=example``, and no gold class equal to its fixed foil."""
        total = len(examples)
        if self.leading == "gold":
            missing = sum(e.label is None for e in examples)
            if missing:
                which = "class=gold" if self.score == "contrastive" else "score=gold"
                raise UsageError(
                    f"target {which} needs a label for every example; {missing} of {total} "
                    "have none"
                )
        if self.foil == "example":
            missing = sum(e.foil is None for e in examples)
            if missing:
                raise UsageError(
                    f"target foil=example needs a foil for every example (Example.foil); "
                    f"{missing} of {total} have none"
                )
        if self.score == "contrastive" and self.leading == "gold" and self.foil is not None:
            foils = [e.foil if self.foil == "example" else self.foil for e in examples]
            same = sum(e.label == f for e, f in zip(examples, foils, strict=True))
            if same:
                raise UsageError(self._same_message(same, total))

    def _same_message(self, same: int, total: int, where: str = "") -> str:
        return (
            f"target {self}: the foil equals the {self.leading} class for {same} of {total} "
            f"examples{where}, whose contrastive score would be 0; choose another foil"
        )

    def positions(self, mask_BN: torch.Tensor) -> torch.Tensor:
        """The target token of each example, (B,) long: 0, or its last real token."""
        import torch

        if self.position == "auto":
            raise ValueError("resolve position=auto first (Target.resolved)")
        if self.position == "first":
            return torch.zeros(mask_BN.shape[0], dtype=torch.long, device=mask_BN.device)
        real_BN = mask_BN.bool()
        index_N = torch.arange(mask_BN.shape[1], device=mask_BN.device)
        return torch.where(real_BN, index_N, -1).amax(dim=1)

    def classes(self, logits_BC: torch.Tensor, labels_B: torch.Tensor | None) -> torch.Tensor:
        """The class whose logit leads the score, (B,) long: predicted, or the label."""
        if self.leading == "predicted":
            return logits_BC.argmax(dim=-1)
        if labels_B is None:
            which = "class=gold" if self.score == "contrastive" else "score=gold"
            raise UsageError(f"target {which} needs a label for every example; this batch has none")
        _check_range("label", labels_B, logits_BC.shape[-1])
        return labels_B.to(logits_BC.device)

    def foils(
        self,
        logits_BC: torch.Tensor,
        classes_B: torch.Tensor,
        example_foils_B: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """The class subtracted by a contrastive score, (B,) long; None for the other scores.

        ``classes_B`` are the leading classes (``classes``), ``example_foils_B`` the examples'
        own foils (``Batch.foils``). A foil equal to its gold class is a UsageError.
        """
        import torch

        if self.score != "contrastive":
            return None
        count = logits_BC.shape[-1]
        if self.foil is None:
            if count < 2:
                raise UsageError("target score=contrastive needs at least two classes")
            if self.class_ == "predicted":  # the second of the top two
                return logits_BC.topk(2, dim=-1).indices[:, 1]
            lead_BC = torch.nn.functional.one_hot(classes_B, count).bool()
            return logits_BC.masked_fill(lead_BC, float("-inf")).argmax(dim=-1)
        if self.foil == "example":
            if example_foils_B is None:
                raise UsageError(
                    "target foil=example needs a foil for every example (Example.foil); "
                    "this batch has none"
                )
            foils_B = example_foils_B.to(logits_BC.device)
        else:
            foils_B = torch.full(classes_B.shape, int(self.foil), device=logits_BC.device)
        _check_range("foil", foils_B, count)
        same = int((foils_B == classes_B).sum())
        # Against the gold class it is a data error; a predicted class that happens to be the
        # fixed foil is the model's choice, and that example's score is 0 (as it always was).
        if same and self.leading == "gold":
            raise UsageError(self._same_message(same, len(classes_B), " of a batch"))
        return foils_B


def _check_range(what: str, classes_B: torch.Tensor, count: int) -> None:
    """A UsageError naming the first class outside ``0..count-1``: a gather would crash."""
    outside = classes_B[(classes_B < 0) | (classes_B >= count)]
    if len(outside):
        raise UsageError(
            f"target {what} {int(outside[0])} is no class index: the logits have {count} classes"
        )


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
#: What next-token data explains when no target is given: at the prefix's last token, the
#: logit of the correct next token (``Example.label``) minus the wrong one's (``Example.foil``).
NEXT_TOKEN_TARGET = Target(position="last", score="contrastive", foil="example", class_="gold")
