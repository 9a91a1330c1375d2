"""One traced forward pass per batch: the single source of model internals for attributors.

The runner asks for the union of what its attributors declare in ``requires`` and captures only
that. Attributors read the trace; they never rerun the model for what the forward pass produced.

The built-in fields (``TRACE_FIELDS``) are captured here; a plugin adds a field with a
:class:`TraceField` returned by the ``attrib_bench_trace_fields`` hook: the modules to hook and
what to keep of each call. Its hooks live for that one forward pass only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from attrib_bench.core import clock
from attrib_bench.core.errors import UsageError
from attrib_bench.core.interfaces import Batch
from attrib_bench.core.target import DEFAULT_TARGET, Target
from attrib_bench.core.trace_fields import TRACE_FIELDS, TraceField
from attrib_bench.model.architectures import EncoderAdapter
from attrib_bench.model.attention_kernels import EAGER, FAST, attention_implementation

if TYPE_CHECKING:  # model.load imports transformers: not needed to read a trace's type
    from attrib_bench.model.load import LoadedModel


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
        else:
            captured = getattr(self, name) if name in TRACE_FIELDS else ()
        if not captured:
            raise RuntimeError(
                f"trace field {name!r} was not captured: add it to the attributor's `requires`"
            )
        return captured

    def release_graph(self) -> None:
        """Free the forward pass's autograd graph (``embedding_graph``) once no method needs it,
        so that it does not outlive its batch's attributions."""
        self.graph_logits_BC = None
        self.graph_layers = {}


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


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(item) for item in value)
    return value


def _keep(module: nn.Module, keep: str, into: list[Any]) -> torch.utils.hooks.RemovableHandle:
    """Hook ``module`` to append to ``into``, on every call, what ``keep`` says (see TraceField),
    detached."""
    if keep in ("input", "call"):

        def before(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            if keep == "call":
                into.append((_detached(args), {k: _detached(v) for k, v in kwargs.items()}))
            else:
                into.append(_detached(args[0] if args else next(iter(kwargs.values()))))

        return module.register_forward_pre_hook(before, with_kwargs=True)
    return module.register_forward_hook(lambda _m, _i, out: into.append(_detached(out)))


def _keep_graph(
    loaded: LoadedModel, into: dict[str, torch.Tensor]
) -> list[torch.utils.hooks.RemovableHandle]:
    """Hook the attribution layers to keep their first output in the graph, by name: the
    embedding module (``LoadedModel.embeddings``) and the word-embedding lookup, which are one
    module in a language model."""
    lookup = loaded.model.get_input_embeddings()
    named = {"embeddings": loaded.embeddings, "word_embeddings": lookup}
    handles = []
    for module in {id(m): m for m in named.values()}.values():
        names = [name for name, m in named.items() if m is module]

        def keep(_m: nn.Module, _i: tuple, output: torch.Tensor, names=names) -> None:
            if not output.requires_grad:  # frozen weights: the lookup's output is a leaf
                output.requires_grad_()
            for name in names:
                into.setdefault(name, output)

        handles.append(module.register_forward_hook(keep))
    return handles


def trace_batch(
    loaded: LoadedModel,
    batch: Batch,
    requires: Iterable[str],
    seed: int = 0,
    fields: Mapping[str, TraceField] | None = None,
    target: Target = DEFAULT_TARGET,
) -> Trace:
    """Run the model once on ``batch`` and capture the fields in ``requires``.

    ``fields`` are the fields plugins registered, by name (``Registry.trace_field_specs()``);
    built-in names in it are captured as built-ins. ``target`` is the run's attribution target,
    kept on the trace for its readers (``position=auto`` resolved to the family's default).
    Every hook is removed after the forward pass, also when it raises. The pass runs eager
    attention when ``attentions`` or a plugin's field is required, sdpa otherwise
    (attrib_bench.model.attention_kernels): hidden states and logits then agree with an eager
    pass to the last float bits, not bit for bit.
    """
    needed = set(requires)
    graph = "embedding_graph" in needed
    extra = {name: f for name, f in (fields or {}).items() if name not in TRACE_FIELDS}
    unknown = needed - TRACE_FIELDS - set(extra)
    if unknown:
        raise UsageError(
            f"unknown trace fields {sorted(unknown)}; valid: "
            + ", ".join(sorted(TRACE_FIELDS | set(extra)))
        )
    captured: dict[str, list[torch.Tensor]] = {
        "values": [],
        "pre_ln1": [],
        "pre_ln2": [],
        "final_norm": [],
    }
    hidden = bool(needed & {"hidden_states", "values", "pre_layernorm"})
    spec = loaded.architectures.get(loaded.model.config.model_type) if hidden else None
    kept: dict[str, list[Any]] = {name: [] for name in sorted(needed & set(extra))}
    handles = []
    try:
        if needed & {"values", "pre_layernorm"}:
            adapter = loaded.adapter
            for layer in range(len(adapter.layers)):
                if "values" in needed:
                    handles.append(
                        adapter.module(layer, "value").register_forward_hook(
                            lambda _m, _i, out: captured["values"].append(
                                adapter.value_vectors(out.detach())
                            )
                        )
                    )
                if "pre_layernorm" in needed:
                    for part, key in (("ln1", "pre_ln1"), ("ln2", "pre_ln2")):
                        handles.append(_keep(adapter.module(layer, part), "input", captured[key]))
        if spec is not None and spec.final_norm:  # pre-LN: the last block's output
            handles.append(_keep(loaded.adapter.final_norm, "input", captured["final_norm"]))
        if kept:
            adapter = loaded.adapter
            for name, into in kept.items():
                for module in extra[name].hooked_modules(adapter):
                    handles.append(_keep(module, extra[name].keep, into))
        graph_layers: dict[str, torch.Tensor] = {}
        if graph:
            handles += _keep_graph(loaded, graph_layers)
        # Eager where the pass is read for attention probabilities or hooked by a plugin's field
        # (a module's call may differ between implementations), sdpa otherwise.
        implementation = EAGER if "attentions" in needed or kept else FAST
        with (
            torch.set_grad_enabled(graph),
            attention_implementation(loaded.model, implementation),
        ):
            out = loaded.model(
                **batch.model_inputs(),
                output_attentions="attentions" in needed,
                output_hidden_states=hidden,
            )
    finally:
        for handle in handles:
            handle.remove()
    hidden_states = tuple(h.detach() for h in out.hidden_states or ())
    if captured["final_norm"]:  # Hugging Face's last entry is the final norm's output
        hidden_states = (*hidden_states[:-1], *captured["final_norm"])
    plugin_fields = {
        name: extra[name].collect(values) if extra[name].collect is not None else tuple(values)
        for name, values in kept.items()
    }
    from attrib_bench.model.load import target_logits  # imports transformers

    resolved = target.resolved(default_target_position(loaded))
    positions_B = resolved.positions(batch.attention_mask_BN)
    logits_BC = target_logits(loaded, out.logits, positions_B)
    return Trace(
        batch=batch,
        loaded=loaded,
        logits_BC=logits_BC.detach(),
        hidden_states=hidden_states,
        attentions=tuple(a.detach() for a in out.attentions or ()),
        graph_logits_BC=logits_BC if graph else None,
        graph_layers=graph_layers,
        values=tuple(captured["values"]),
        pre_ln1=tuple(captured["pre_ln1"]),
        pre_ln2=tuple(captured["pre_ln2"]),
        plugin_fields=plugin_fields,
        field_specs=extra,
        seed=seed,
        target=target,
    )
