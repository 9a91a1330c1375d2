"""A run's state: its configuration, its resolved inputs, and each method's running scores.

What the engine fills in and the result document (attrib_bench.runner.document) and the cache
(attrib_bench.runner.cache) read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from attrib_bench.core import console
from attrib_bench.core.errors import check_seed
from attrib_bench.core.interfaces import KINDS, Attribution, Batch
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.registry import Registry
from attrib_bench.core.target import DEFAULT_TARGET, Target
from attrib_bench.data.batches import BatchPlan
from attrib_bench.data.load import LoadedData
from attrib_bench.results.agreement import DEFAULT_K
from attrib_bench.runner.scores import ExampleIndex, ScoreColumn

#: The method every other is compared with, unless ``--reference`` names another.
DEFAULT_REFERENCE = "saliency"


@dataclass
class RunConfig:
    """Everything that decides a run's numbers (batch size and device do not)."""

    model: str | None = None
    #: A run over several models of one architecture (seeds): see attrib_bench.runner.models.
    models: list[str] | None = None
    dataset: str | None = None
    split: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    limit: int | None = None
    max_length: int | None = None
    attributors: list[str] | None = None
    evaluators: list[str] | None = None
    reference: str = DEFAULT_REFERENCE
    seed: int = 0
    batch_size: int = 16
    device: str = "auto"
    plugins: list[str] = field(default_factory=list)
    #: The attribution target (attrib_bench.core.target): which token's row, which score.
    #: None (not given): ``NEXT_TOKEN_TARGET`` for next-token data, else ``DEFAULT_TARGET``,
    #: whose ``position=auto`` is the model family's own.
    target: str | None = None
    #: k of the agreement between methods at top k (attrib_bench.results.agreement); 0: off.
    agreement_k: int = DEFAULT_K
    #: Whether the ``random`` floor joins the leaderboard when not selected (``--no-floor``).
    floor: bool = True
    #: ``"i/N"``: only the i-th of N contiguous slices of the run's batches (``--shard``), for
    #: runs on independent machines that ``attrib-bench merge`` joins; None: every example.
    shard: str | None = None

    def __post_init__(self) -> None:
        check_seed(self.seed)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MethodState:
    """Running state of one method: timing, per-example scores, failures."""

    spec: str
    attributor: Any
    seconds: float = 0.0
    examples: int = 0
    #: Largest standalone memory of one batch (see attrib_bench.runner.memory.standalone_megabytes).
    peak_memory_mb: float = 0.0
    #: The standalone memory of the last batch computed: what that batch's cache entries record.
    batch_memory_mb: float = 0.0
    #: Why the method is on the leaderboard without being selected: "floor" or "reference".
    added_as: str | None = None
    error: str | None = None
    #: evaluator -> its error on this method alone (the evaluator still scores the others)
    evaluator_errors: dict[str, str] = field(default_factory=dict)
    #: evaluator -> kind -> example id -> scores over layers (a compact ``ScoreColumn``)
    scores: dict[str, dict[str, Mapping[str, np.ndarray]]] = field(default_factory=dict)
    #: The method's examples numbered once for all its score columns.
    index: ExampleIndex = field(default_factory=ExampleIndex)
    #: example id -> kind -> rows (L, N real tokens), kept only when a run over several
    #: models asks (None: not kept); computed or read from the cache alike.
    rows: dict[str, dict[str, np.ndarray]] | None = None

    def column(self, evaluator: str, key: str) -> ScoreColumn:
        """The scores of ``evaluator`` under ``key`` (a kind, or ``kind/part``), made empty on
        first use."""
        table = self.scores.setdefault(evaluator, {})
        if key not in table:
            table[key] = ScoreColumn(self.index)
        return table[key]

    def keep_rows(self, attribution: Attribution, batch: Batch) -> None:
        if self.rows is None:
            return
        for row, (example, length) in enumerate(zip(batch.examples, batch.lengths, strict=True)):
            self.rows[example.id] = {
                kind: np.asarray(values, dtype=float)
                for kind in KINDS
                if (values := attribution.example_rows(kind, row, length)) is not None
            }

    def fail(self, error: str) -> None:
        self.error = error
        console.warn(f"{self.spec} failed and is dropped: {error}")

    def undefined(self, evaluator: str) -> bool:
        """True when the evaluator scored no example of this method (all NaN)."""
        kinds = self.scores.get(evaluator, {})
        values = [v for by_id in kinds.values() for v in by_id.values()]
        return bool(values) and all(np.isnan(v).all() for v in values)


@dataclass
class Prepared:
    """A run's resolved inputs: plugins, model, data and the plan of its batches."""

    registry: Registry
    loaded: LoadedModel
    data: LoadedData
    #: The batches, tokenised one at a time as they are read (a run streams them).
    batches: BatchPlan
    truncated: int
    max_length: int
    #: Ids of examples with no content token (see attrib_bench.data.batches.contentless_ids).
    contentless: list[str] = field(default_factory=list)
    #: The run's attribution target, parsed from ``RunConfig.target`` and resolved for the
    #: model (``position=auto`` -> the family's ``target_position``): what the traces, the
    #: result's ``target`` record and the cache keys see.
    target: Target = DEFAULT_TARGET
    #: Next-token examples dropped because their two words share the first token.
    shared_first_token: int = 0
    #: (rationale words truncation cut off, rationale words): counts, so shards add up.
    rationale_words: tuple[int, int] = (0, 0)
    #: Under ``--shard``: each example's index in the unsharded data (``merge`` restores the
    #: dataset order from them); None for a run over all the data.
    positions: list[int] | None = None

    @property
    def rationale_words_lost(self) -> float | None:
        """Share of rationale words truncation cut off (None: no rationale words)."""
        lost, total = self.rationale_words
        return lost / total if total else None
