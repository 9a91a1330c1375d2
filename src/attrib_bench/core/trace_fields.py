"""The fields a trace can capture: the built-ins and the ``TraceField`` type plugins register.

A plain data type that plugins return from the ``attrib_bench_trace_fields`` hook; the capture
itself is ``attrib_bench.model.trace.trace_batch``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attrib_bench.core.errors import UsageError

if TYPE_CHECKING:
    from torch import nn

    from attrib_bench.core.adapter import EncoderAdapter

#: What a module hook keeps of each call: its return value, its first input, or every argument.
KEEP = ("output", "input", "call")


@dataclass(frozen=True)
class TraceField:
    """A field the trace can capture, which an attributor then lists in ``requires``.

    - ``name``: what ``requires`` lists and ``trace.need(name)`` reads.
    - ``doc``: one line on what the field holds (shapes, order).
    - ``modules``: the modules to hook: a dotted path inside each encoder layer
      (``"intermediate"`` hooks ``layer.intermediate`` of every layer, in layer order), or a
      function of the trace's ``EncoderAdapter`` returning the modules (``lambda adapter:
      [adapter.model.classifier]`` for the classification head). None only for the built-ins,
      which this module captures itself.
    - ``keep``: ``"output"`` (what the module returns), ``"input"`` (its first argument) or
      ``"call"`` (the pair ``(args, kwargs)`` it was called with, to run it again: value zeroing
      reruns a layer with some value vectors zeroed).
    - ``collect``: makes the field from the kept values, detached, one per call in the order the
      modules ran; by default the tuple of them.
    """

    name: str
    doc: str
    modules: str | Callable[[EncoderAdapter], Sequence[nn.Module]] | None = None
    keep: str = "output"
    collect: Callable[[list[Any]], Any] | None = None

    def problem(self) -> str | None:
        """Why a plugin cannot register this field, or None: checked when plugins are loaded."""
        if not isinstance(self.name, str) or not self.name.strip():
            return f"name must be a non-empty string, got {self.name!r}"
        if not (isinstance(self.modules, str) and self.modules) and not callable(self.modules):
            return (
                f"field {self.name!r}: modules must be a dotted path inside each layer or a "
                f"function of the adapter returning modules, got {self.modules!r}"
            )
        if self.keep not in KEEP:
            return f"field {self.name!r}: keep={self.keep!r} is not one of {', '.join(KEEP)}"
        if self.collect is not None and not callable(self.collect):
            return f"field {self.name!r}: collect must be callable, got {self.collect!r}"
        return None

    def hooked_modules(self, adapter: EncoderAdapter) -> list[nn.Module]:
        """The distinct modules to hook on this model, in order."""
        if isinstance(self.modules, str):
            modules = []
            for layer, module in enumerate(adapter.layers):
                try:
                    modules.append(module.get_submodule(self.modules))
                except AttributeError as error:
                    raise UsageError(
                        f"trace field {self.name!r}: encoder layer {layer} has no module "
                        f"{self.modules!r} ({error})"
                    ) from error
        else:
            modules = list(self.modules(adapter))
        return list({id(module): module for module in modules}.values())


#: The built-in fields, captured by ``trace_batch`` itself; a plugin field cannot reuse a name.
BUILTIN_FIELDS: tuple[TraceField, ...] = (
    TraceField("attentions", "L tensors (B, H, N, K) of attention probabilities"),
    TraceField(
        "hidden_states",
        "L + 1 tensors (B, N, D): hidden_states[l] is layer l + 1's input; the last is the "
        "last layer's output (in pre-LN models the final norm's input)",
    ),
    TraceField(
        "values",
        "L tensors (B, N, H_kv*E): value vectors x W_V + b_V (N1(x) W_V + b_V in pre-LN "
        "blocks; the value part of a fused projection)",
    ),
    TraceField(
        "pre_layernorm",
        "the inputs of each layer's two LayerNorms: trace.pre_ln1, trace.pre_ln2 (L tensors "
        "(B, N, D) each)",
    ),
    TraceField(
        "embedding_graph",
        "the forward pass run with autograd: trace.graph_logits_BC (the target logits, (B, C), "
        "not detached) and trace.graph_layers['embeddings' | 'word_embeddings'] "
        "(LoadedModel.embeddings' and the word-embedding lookup's outputs, (B, N, D)), so a "
        "gradient method backpropagates through the trace's own pass (retain_graph=True); "
        "with attentions or hidden_states also required, trace.graph_attentions and "
        "trace.graph_hidden_states (the same tensors still in the graph); released once every "
        "method has read the batch",
    ),
    TraceField(
        "cp_lrp_graph",
        "a forward pass under CP-LRP's backward rules (attrib_bench.toolkit.lrp_rules) run with "
        "autograd: trace.lrp_graphs['cp'], the target logits and the attribution layers' "
        "outputs in its graph and why the rules could not reach the model (None when they "
        "did); the traced pass itself when nothing else needs a plain graph or the attention "
        "probabilities, else one pass more; released with the embedding graph",
    ),
    TraceField(
        "attn_lrp_graph",
        "the same under AttnLRP's rules: trace.lrp_graphs['attn']",
    ),
)
#: What a trace can hold without plugins; an attributor's ``requires`` is a subset of these and
#: of the fields plugins register.
TRACE_FIELDS = frozenset(f.name for f in BUILTIN_FIELDS)
#: The fields of a pass under LRP rules, and the variant of attrib_bench.toolkit.lrp_rules each
#: names.
LRP_GRAPH_FIELDS = {"cp_lrp_graph": "cp", "attn_lrp_graph": "attn"}
