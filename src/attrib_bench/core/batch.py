"""The data every plugin reads: one example, and a padded batch of them on the model's device.

Here, below the trace and the interfaces that name them, so that both can (shape key: see
attrib_bench.core.interfaces).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Example:
    """One input to classify. ``rationale`` marks decisive words of ``text.split()`` (1/0);
    ``foil`` is the class a ``--target ...,foil=example`` contrast subtracts (a class index
    into the logits, like ``label``)."""

    id: str
    text: str
    text_pair: str | None = None
    label: int | None = None
    rationale: tuple[int, ...] | None = None
    foil: int | None = None


@dataclass
class Batch:
    """Tokenised, padded examples; every tensor row belongs to ``examples[b]``.

    ``word_ids_BN`` (on the CPU): per token, the index of its word in ``examples[b].text.split()``
    (from the fast tokenizer's offsets), -1 for special tokens, padding and a pair's second text.
    """

    examples: list[Example]
    input_ids_BN: torch.Tensor
    attention_mask_BN: torch.Tensor
    token_type_ids_BN: torch.Tensor | None
    special_tokens_mask_BN: torch.Tensor
    tokens: list[list[str]]
    word_ids_BN: torch.Tensor | None = None

    def model_inputs(self) -> dict[str, torch.Tensor]:
        inputs = {"input_ids": self.input_ids_BN, "attention_mask": self.attention_mask_BN}
        if self.token_type_ids_BN is not None:
            inputs["token_type_ids"] = self.token_type_ids_BN
        return inputs

    @property
    def lengths(self) -> list[int]:
        return self.attention_mask_BN.sum(dim=1).tolist()

    @property
    def labels(self) -> torch.Tensor | None:
        labels = [e.label for e in self.examples]
        if any(label is None for label in labels):
            return None
        return torch.tensor(labels, device=self.input_ids_BN.device)

    @property
    def foils(self) -> torch.Tensor | None:
        """The examples' own foil classes (``Example.foil``), (B,); None if one has none."""
        foils = [e.foil for e in self.examples]
        if any(foil is None for foil in foils):
            return None
        return torch.tensor(foils, dtype=torch.long, device=self.input_ids_BN.device)

    def to(self, device: torch.device | str) -> Batch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return Batch(
            self.examples,
            self.input_ids_BN.to(device),
            self.attention_mask_BN.to(device),
            move(self.token_type_ids_BN),
            self.special_tokens_mask_BN.to(device),
            self.tokens,
            self.word_ids_BN,
        )
