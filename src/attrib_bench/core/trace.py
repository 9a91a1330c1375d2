"""What every attributor reads: the internals of one batch, captured by one traced forward
pass (attrib_bench.model.trace.trace_batch), and a per-batch memo for shared pieces.

The built-in fields are ``TRACE_FIELDS`` (attrib_bench.core.trace_fields); a plugin's field is
read with ``Trace.need(name)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from attrib_bench.core import clock
from attrib_bench.core.adapter import EncoderAdapter
from attrib_bench.core.batch import Batch
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.target import DEFAULT_TARGET, Target
from attrib_bench.core.trace_fields import LRP_GRAPH_FIELDS, TRACE_FIELDS, TraceField


@dataclass(frozen=True)
class LRPGraph:
    """A forward pass under one variant's LRP rules (attrib_bench.toolkit.lrp_rules), kept in
    its autograd graph: gradient x input through it is the relevance."""

    #: The target logits (B, C), not detached.
    logits_BC: torch.Tensor | None
    #: The attribution layers' outputs by name (``embeddings``, ``word_embeddings``).
    layers: dict[str, torch.Tensor]
    #: Why the rules could not reach the model (one line), or None.
    problem: str | None = None


@dataclass
class Trace:
    """Internals of one batch, all detached (but the graph fields) and on the model's device.

    - ``logits_BC``: always present (every method needs the predicted class); a language
      model's next-token logits at each example's target position (``target_logits``).
    - ``hidden_states``: L + 1 tensors (B, N, D); ``hidden_states[l]`` is the input of layer
      l + 1 (``hidden_states[0]`` is the embedding output), ``hidden_states[L]`` the last
      layer's output: in a pre-LN model the final norm's input (Hugging Face's last entry is
      that norm's output).
    - ``attentions``: L tensors (B, H, N, K) of attention probabilities.
    - ``values``: L tensors (B, N, H_kv*E): value vectors x W_V + b_V (N1(x) W_V + b_V in a
      pre-LN block; the value part of a fused projection's output).
    - ``pre_ln1`` / ``pre_ln2``: L tensors (B, N, D): the inputs of each layer's two norms.
    - ``graph_logits_BC`` / ``graph_layers``: with ``embedding_graph`` required, the target
      logits and the attribution layers' outputs by name (``embeddings``, ``word_embeddings``)
      still joined by the forward pass's autograd graph, until ``release_graph``.
    - ``graph_attentions``: with ``embedding_graph`` and ``attentions`` both required, the
      attention probabilities (L tensors (B, H, N, K)) still in that graph, for methods that
      differentiate with respect to them (``attrib_bench.toolkit.graph_gradients``);
      ``graph_hidden_states`` likewise the hidden states (L + 1 tensors (B, N, D), Hugging
      Face's, the last one after a pre-LN model's final norm) when ``hidden_states`` is required.
    - ``lrp_graphs``: with ``cp_lrp_graph`` or ``attn_lrp_graph`` required, per variant
      (``cp``, ``attn``) an :class:`LRPGraph`: a pass under that variant's LRP rules, still in
      its autograd graph, until ``release_graph``.
    - ``plugin_fields``: the captured fields plugins registered, by name (read them with
      ``need(name)``).
    - ``shared``: a per-batch memo so methods of one family compute shared pieces once.
    - ``target``: the run's attribution target (attrib_bench.core.target), its ``position=auto``
      resolved to the model family's default; read it through ``target_positions_B``,
      ``target_classes_B`` and ``target_foils_B``.
    """

    batch: Batch
    loaded: LoadedModel
    logits_BC: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] = ()
    attentions: tuple[torch.Tensor, ...] = ()
    values: tuple[torch.Tensor, ...] = ()
    pre_ln1: tuple[torch.Tensor, ...] = ()
    pre_ln2: tuple[torch.Tensor, ...] = ()
    graph_logits_BC: torch.Tensor | None = None
    graph_layers: dict[str, torch.Tensor] = field(default_factory=dict)
    graph_attentions: tuple[torch.Tensor, ...] = ()
    graph_hidden_states: tuple[torch.Tensor, ...] = ()
    lrp_graphs: dict[str, LRPGraph] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    #: The run's seed, for methods with randomness (baselines, sampling).
    seed: int = 0
    #: Seconds spent computing each memo entry, and the entries read since ``reset_access``.
    memo_seconds: dict[str, float] = field(default_factory=dict)
    accessed: set[str] = field(default_factory=set)
    plugin_fields: dict[str, Any] = field(default_factory=dict)
    #: The plugin fields it could capture, by name: what an evaluator that traces the model
    #: again passes on (``trace_batch(..., fields=trace.field_specs)``).
    field_specs: Mapping[str, TraceField] = field(default_factory=dict)
    target: Target = DEFAULT_TARGET

    def __post_init__(self) -> None:
        self.target = self.target.resolved(default_target_position(self.loaded))

    @property
    def model(self) -> torch.nn.Module:
        return self.loaded.model

    @property
    def adapter(self) -> EncoderAdapter:
        return self.loaded.adapter

    @property
    def num_layers(self) -> int:
        return self.loaded.model.config.num_hidden_layers

    @property
    def predicted_B(self) -> torch.Tensor:
        return self.logits_BC.argmax(dim=-1)

    @property
    def mask_BN(self) -> torch.Tensor:
        return self.batch.attention_mask_BN

    @property
    def target_positions_B(self) -> torch.Tensor:
        """Per example, the token whose row is explained (0 unless ``position=last``)."""
        # Resolved again: ``target`` may have been assigned after construction.
        target = self.target.resolved(default_target_position(self.loaded))
        return target.positions(self.mask_BN)

    @property
    def target_classes_B(self) -> torch.Tensor:
        """Per example, the class the target score leads with (predicted, or the label)."""
        return self.target.classes(self.logits_BC, self.batch.labels)

    @property
    def target_foils_B(self) -> torch.Tensor | None:
        """Per example, the class a contrastive score subtracts (the runner-up, a fixed class
        or the example's own ``Example.foil``); None for the other scores."""
        return self.target.foils(self.logits_BC, self.target_classes_B, self.batch.foils)

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """Return ``shared[key]``, computing it on first use within this batch.

        Its compute time (on ``attrib_bench.core.clock``) is recorded so that every method
        reading it is charged the same standalone cost, whichever of them happened to run first.
        """
        if key not in self.shared:
            start = clock.now()
            self.shared[key] = compute()
            self.memo_seconds[key] = clock.now() - start
        self.accessed.add(key)
        return self.shared[key]

    def standalone_seconds(self, elapsed: float, computed_before: set[str]) -> float:
        """A method's cost as if run alone: its own time plus every shared piece it read."""
        computed_now = set(self.memo_seconds) - computed_before
        own = elapsed - sum(self.memo_seconds[k] for k in computed_now)
        return own + sum(self.memo_seconds[k] for k in self.accessed)

    def need(self, name: str) -> tuple[Any, ...]:
        """A captured field, or a clear error when the attributor forgot to declare it.

        A built-in field is its attribute (``need("pre_layernorm")`` is the pair ``(pre_ln1,
        pre_ln2)``); a plugin field is what its ``collect`` made.
        """
        if name in self.plugin_fields:
            return self.plugin_fields[name]
        if name == "pre_layernorm":
            captured = (self.pre_ln1, self.pre_ln2) if self.pre_ln1 else ()
        elif name == "embedding_graph":
            graph = self.graph_logits_BC is not None
            captured = (self.graph_logits_BC, self.graph_layers) if graph else ()
        elif name in LRP_GRAPH_FIELDS:
            variant = LRP_GRAPH_FIELDS[name]
            captured = (self.lrp_graphs[variant],) if variant in self.lrp_graphs else ()
        else:
            captured = getattr(self, name) if name in TRACE_FIELDS else ()
        if not captured:
            raise RuntimeError(
                f"trace field {name!r} was not captured: add it to the attributor's `requires`"
            )
        return captured

    def release_graph(self) -> None:
        """Free the forward passes' autograd graphs (``embedding_graph``, the LRP graphs) once
        no method needs them, so that they do not outlive their batch's attributions."""
        self.lrp_graphs = {}
        self.graph_logits_BC = None
        self.graph_layers = {}
        self.graph_attentions = ()
        self.graph_hidden_states = ()


def default_target_position(loaded: LoadedModel | None) -> str:
    """What ``--target position=auto`` means for this model: its family spec's
    ``target_position``; for a model without a spec "last" for a language model (the position
    that predicts the next token), else "first" (also for a stand-in without a model)."""
    architectures = getattr(loaded, "architectures", None)
    config = getattr(getattr(loaded, "model", None), "config", None)
    if architectures is None or config is None:
        return "first"
    spec = architectures.get(config.model_type)
    if spec is None:
        return "last" if getattr(loaded, "is_language_model", False) else "first"
    return spec.target_position
