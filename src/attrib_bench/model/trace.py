"""One traced forward pass per batch: the single source of model internals for attributors.

The runner asks for the union of what its attributors declare in ``requires`` and captures only
that. Attributors read the trace; they never rerun the model for what the forward pass produced.
The one exception is a pass under LRP rules (``cp_lrp_graph``, ``attn_lrp_graph``): it is the
traced pass itself when nothing else needs that pass's plain graph, attention probabilities or
hooks, and a pass of its own beside it otherwise.

The built-in fields (``TRACE_FIELDS``) are captured here; a plugin adds a field with a
:class:`TraceField` returned by the ``attrib_bench_trace_fields`` hook: the modules to hook and
what to keep of each call. Its hooks live for that one forward pass only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from attrib_bench.core.attention_kernels import EAGER, FAST, attention_implementation
from attrib_bench.core.errors import UsageError
from attrib_bench.core.interfaces import Batch
from attrib_bench.core.loaded_model import LoadedModel, target_logits
from attrib_bench.core.target import DEFAULT_TARGET, Target
from attrib_bench.core.trace import LRPGraph, Trace, default_target_position
from attrib_bench.core.trace_fields import LRP_GRAPH_FIELDS, TRACE_FIELDS, TraceField
from attrib_bench.toolkit.lrp_rules import rules


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


def _unreached(loaded: LoadedModel, record: dict[str, Any]) -> str | None:
    """Why the rules of a finished pass did not reach the model's attention, or None."""
    if record["calls"]:
        return None
    return (
        f"{loaded.model.config.model_type} does not run its attention through transformers' "
        "attention interface, so the rules cannot reach it"
    )


def _lrp_pass(loaded: LoadedModel, batch: Batch, variant: str, positions_B: torch.Tensor):
    """A forward pass of its own under ``variant``'s LRP rules, kept in its graph."""
    layers: dict[str, torch.Tensor] = {}
    handles = _keep_graph(loaded, layers)
    try:
        with torch.enable_grad(), rules(loaded.model, variant) as record:
            out = loaded.model(**batch.model_inputs())
    except UsageError as error:  # a norm the rules do not know: the method says so
        return LRPGraph(None, {}, str(error))
    except Exception as error:  # the LRP method fails, not the batch's other methods
        return LRPGraph(None, {}, f"the forward pass under the rules failed: {error!r}")
    finally:
        for handle in handles:
            handle.remove()
    logits_BC = target_logits(loaded, out.logits, positions_B)
    return LRPGraph(logits_BC, layers, _unreached(loaded, record))


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
    (attrib_bench.core.attention_kernels): hidden states and logits then agree with an eager
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
        # A pass under LRP rules changes no forward value, so it is the traced pass itself when
        # nothing else reads this pass's graph or attention probabilities or hooks it.
        variants = [LRP_GRAPH_FIELDS[name] for name in sorted(needed & set(LRP_GRAPH_FIELDS))]
        shared = variants[0] if variants and not (graph or kept or "attentions" in needed) else None
        lrp_layers: dict[str, torch.Tensor] = {}
        if shared:
            handles += _keep_graph(loaded, lrp_layers)
        # Eager where the pass is read for attention probabilities or hooked by a plugin's field
        # (a module's call may differ between implementations), sdpa otherwise.
        implementation = EAGER if "attentions" in needed or kept else FAST
        with torch.set_grad_enabled(graph or bool(shared)):
            if shared:
                try:
                    with rules(loaded.model, shared) as record:
                        out = loaded.model(**batch.model_inputs(), output_hidden_states=hidden)
                except Exception:  # e.g. a norm the rules do not know: a plain pass, as
                    # without them; the pass of its own below tells the method why
                    shared, lrp_layers = None, {}
            if not shared:
                with attention_implementation(loaded.model, implementation):
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
    resolved = target.resolved(default_target_position(loaded))
    positions_B = resolved.positions(batch.attention_mask_BN)
    logits_BC = target_logits(loaded, out.logits, positions_B)
    lrp_graphs = {}
    if shared:
        lrp_graphs[shared] = LRPGraph(logits_BC, lrp_layers, _unreached(loaded, record))
    for variant in variants:
        if variant not in lrp_graphs:
            lrp_graphs[variant] = _lrp_pass(loaded, batch, variant, positions_B)
    return Trace(
        batch=batch,
        loaded=loaded,
        logits_BC=logits_BC.detach(),
        hidden_states=hidden_states,
        attentions=tuple(a.detach() for a in out.attentions or ()),
        graph_logits_BC=logits_BC if graph else None,
        graph_layers=graph_layers,
        graph_attentions=tuple(out.attentions or ()) if graph else (),
        graph_hidden_states=tuple(out.hidden_states or ()) if graph else (),
        lrp_graphs=lrp_graphs,
        values=tuple(captured["values"]),
        pre_ln1=tuple(captured["pre_ln1"]),
        pre_ln2=tuple(captured["pre_ln2"]),
        plugin_fields=plugin_fields,
        field_specs=extra,
        seed=seed,
        target=target,
    )
