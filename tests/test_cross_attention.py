"""Attention through an encoder-decoder model's cross-attention (plugins/cross_attention.py),
in float64 on tiny random T5, BART and Marian models, against a reference written from Chefer,
Gur & Wolf's official encoder-decoder code (its DETR generator: the relevance matrices as
attributes, updated layer by layer) on attention maps taken from the model's own pass from
token ids."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, save_tiny_decoder
from test_segments import EXAMPLE, TEMPLATE, write_jsonl
from test_seq2seq import _close

from attrib_bench.model.load import load_model
from attrib_bench.segments.scorer import SegmentScorer
from attrib_bench.testing.segment_conformance import SEQ2SEQ_FAMILIES, save_tiny_seq2seq
from attrib_bench_plugins.cross_attention import CrossAttention, CrossGae, CrossRollout

ANSWER = replace(EXAMPLE, answer=" the cat sat")


@pytest.fixture(scope="module", params=SEQ2SEQ_FAMILIES)
def seq2seq64(request, tmp_path_factory):
    directory = save_tiny_seq2seq(tmp_path_factory.mktemp(request.param), request.param)
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def _maps(loaded, scorer: SegmentScorer, continuation: list[int], with_grad: bool):
    """The model's attention maps from token ids, per layer (H, n, m), and the continuation's
    per-step log-probabilities; with gradients, through the embedding matrix made trainable."""
    model = loaded.model
    labels = torch.tensor([continuation])
    weight = model.get_input_embeddings().weight
    weight.requires_grad_(with_grad)
    try:
        out = model(
            input_ids=torch.tensor([scorer.prompt_ids]),
            labels=labels,
            output_attentions=True,
            use_cache=False,
        )
    finally:
        weight.requires_grad_(False)
    log_probs = torch.log_softmax(out.logits[0], -1)[torch.arange(len(continuation)), labels[0]]
    return out.encoder_attentions, out.decoder_attentions, out.cross_attentions, log_probs


def _handle_residual(relevance: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(relevance.shape[-1], dtype=relevance.dtype)
    hat = relevance - eye
    assert hat.diagonal().min() >= 0
    return hat / hat.sum(dim=-1, keepdim=True) + eye


def _avg_heads(cam: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    return (grad * cam).clamp(min=0).mean(dim=0)


class Reference:
    """The official generator's ``generate_ours`` (use_lrp=False, normalize_self_attention and
    apply_self_in_rule_10 on) and ``generate_rollout``, for one decoder position."""

    def __init__(self, encoder, decoder, cross, transpose=True):
        """``transpose=False``: R_q_q in place of its transpose (the causal form)."""
        self.encoder, self.decoder, self.cross = encoder, decoder, cross
        self.flip = (lambda m: m.t()) if transpose else (lambda m: m)
        S, T = cross[0].shape[-1], cross[0].shape[-2]
        self.R_i_i = torch.eye(S, dtype=torch.float64)
        self.R_q_q = torch.eye(T, dtype=torch.float64)
        self.R_q_i = torch.zeros(T, S, dtype=torch.float64)

    def ours(self, grads):
        enc_g, dec_g, cross_g = grads
        for cam, grad in zip(self.encoder, enc_g, strict=True):
            self.R_i_i = self.R_i_i + _avg_heads(cam[0], grad[0]) @ self.R_i_i
        for layer in range(len(self.decoder)):
            cam = _avg_heads(self.decoder[layer][0], dec_g[layer][0])
            q_q_add, q_i_add = cam @ self.R_q_q, cam @ self.R_q_i
            self.R_q_q = self.R_q_q + q_q_add
            self.R_q_i = self.R_q_i + q_i_add
            cam_q_i = _avg_heads(self.cross[layer][0], cross_g[layer][0])
            mixed = self.flip(_handle_residual(self.R_q_q))
            added = mixed @ (cam_q_i @ _handle_residual(self.R_i_i))
            added[torch.isnan(added)] = 0
            self.R_q_i = self.R_q_i + added
        return self.R_q_i, self.R_q_q

    def rollout(self):
        def compute_rollout(mats):
            eye = torch.eye(mats[0].shape[-1], dtype=torch.float64)
            mats = [(m + eye) / (m + eye).sum(dim=-1, keepdim=True) for m in mats]
            joint = mats[0]
            for m in mats[1:]:
                joint = m @ joint
            return joint

        R_i_i = compute_rollout([a[0].mean(0) for a in self.encoder])
        R_q_q = compute_rollout([a[0].mean(0) for a in self.decoder])
        return self.flip(R_q_q) @ (self.cross[-1][0].mean(0) @ R_i_i), R_q_q


def _segments(scorer: SegmentScorer, rows_TN: torch.Tensor) -> np.ndarray:
    owner = scorer.token_segments
    rows = rows_TN.detach().numpy()
    return np.stack([rows[:, owner == s].sum(1) for s in range(scorer.count)], axis=1)


def test_cross_attention_is_the_last_cross_attention(seq2seq64):
    scorer = SegmentScorer(seq2seq64, ANSWER, TEMPLATE)
    T = len(scorer.answer_ids)
    with torch.no_grad():
        _, decoder, cross, _ = _maps(seq2seq64, scorer, scorer.answer_ids, False)
    last = cross[-1][0].mean(0)
    np.testing.assert_allclose(last.sum(-1).numpy(), 1.0)  # each row: a distribution
    steps = CrossAttention().attribute_steps(scorer)
    _close(seq2seq64, steps.segments_TS, _segments(scorer, last))
    _close(seq2seq64, steps.prefix_TP, decoder[-1][0].mean(0)[:, 1:T].numpy())


@pytest.mark.parametrize("transpose", [True, False])
def test_cross_rollout_is_the_official_rollout(seq2seq64, transpose):
    scorer = SegmentScorer(seq2seq64, ANSWER, TEMPLATE)
    T = len(scorer.answer_ids)
    with torch.no_grad():
        encoder, decoder, cross, _ = _maps(seq2seq64, scorer, scorer.answer_ids, False)
    expected, target = Reference(encoder, decoder, cross, transpose).rollout()
    method = CrossRollout().configure({"transpose": str(transpose).lower()})
    steps = method.attribute_steps(scorer)
    _close(seq2seq64, steps.segments_TS, _segments(scorer, expected))
    _close(seq2seq64, steps.prefix_TP, target[:, 1:T].numpy())
    assert (steps.prefix_TP[np.triu_indices(T, 0, T - 1)] == 0).all()  # a causal decoder
    if not transpose:  # step t reads positions up to itself: row-stochastic products
        rows, _ = method.relevance(scorer, 0)
        np.testing.assert_allclose(rows.sum(-1).numpy(), 1.0, rtol=1e-12)


@pytest.mark.parametrize("transpose", [True, False])
def test_cross_gae_is_the_official_rules_per_step(seq2seq64, transpose):
    """Row t: the official rules with the gradients of log p(a_t) at every attention map (the
    causal form: R_q_q for its transpose)."""
    scorer = SegmentScorer(seq2seq64, ANSWER, TEMPLATE)
    T = len(scorer.answer_ids)
    encoder, decoder, cross, log_probs = _maps(seq2seq64, scorer, scorer.answer_ids, True)
    rows, prefix = [], []
    for t in range(T):
        grads = [torch.autograd.grad(log_probs[t], m, retain_graph=True) for m in (encoder,)]
        grads += [torch.autograd.grad(log_probs[t], m, retain_graph=True) for m in (decoder,)]
        grads += [torch.autograd.grad(log_probs[t], m, retain_graph=True) for m in (cross,)]
        maps = [tuple(a.detach() for a in m) for m in (encoder, decoder, cross)]
        R_q_i, R_q_q = Reference(*maps, transpose).ours(grads)
        rows.append(R_q_i[t])
        prefix.append(R_q_q[t, 1:T].numpy())
    method = CrossGae().configure({"transpose": str(transpose).lower()})
    steps = method.attribute_steps(scorer)
    _close(seq2seq64, steps.segments_TS, _segments(scorer, torch.stack(rows)))
    _close(seq2seq64, steps.prefix_TP, np.array(prefix))
    _close(seq2seq64, method.attribute_segments(scorer), steps.segments_TS.sum(0))
    if transpose:  # later positions' rows get no gradient: NaN, set to 0, clears the product
        assert (steps.segments_TS[:-1] == 0).all()
    else:
        assert (np.abs(steps.segments_TS).sum(1) > 0).all()


def test_a_foil_adds_its_own_decodings_rows(seq2seq64):
    """Contrastive: the answer's rows, then the foil decoding's; negated where the method reads
    no score, and from the gradient of minus the foil's log-probability for cross-gae."""
    contrast = replace(ANSWER, foil=" a dog")
    scorer = SegmentScorer(seq2seq64, contrast, TEMPLATE)
    plain = SegmentScorer(seq2seq64, replace(contrast, foil=None), TEMPLATE)
    foil = SegmentScorer(seq2seq64, replace(contrast, answer=" a dog", foil=None), TEMPLATE)
    steps = CrossAttention().attribute_steps(scorer)
    answer_rows = CrossAttention().attribute_steps(plain).segments_TS
    foil_rows = CrossAttention().attribute_steps(foil).segments_TS
    _close(seq2seq64, steps.segments_TS, np.concatenate([answer_rows, -foil_rows]))

    encoder, decoder, cross, log_probs = _maps(seq2seq64, foil, foil.answer_ids, True)
    maps = [tuple(a.detach() for a in m) for m in (encoder, decoder, cross)]
    rows = []
    for t in range(len(foil.answer_ids)):
        grads = [torch.autograd.grad(-log_probs[t], m, retain_graph=True) for m in (encoder,)]
        grads += [torch.autograd.grad(-log_probs[t], m, retain_graph=True) for m in (decoder,)]
        grads += [torch.autograd.grad(-log_probs[t], m, retain_graph=True) for m in (cross,)]
        rows.append(Reference(*maps, transpose=False).ours(grads)[0][t])
    gae = CrossGae().attribute_steps(scorer).segments_TS
    _close(seq2seq64, gae[len(plain.answer_ids) :], _segments(foil, torch.stack(rows)))


def test_context_runs_them_on_seq2seq_and_skips_them_on_a_causal_model(run_cli, tmp_path):
    record = {"id": "a", "segments": list(EXAMPLE.segments), "query": "who sat?"}
    data = write_jsonl(tmp_path / "d.jsonl", [{**record, "answer": " the cat"}])
    report = tmp_path / "report.json"
    methods = "cross-attention,cross-rollout:transpose=false,cross-gae,random"
    for kind, save in (("bart", save_tiny_seq2seq), ("gpt2", save_tiny_decoder)):
        model = save(tmp_path / kind, kind)
        code, _, err = run_cli(
            "context", "--dataset", data, "--model", model, "--template", TEMPLATE, "--quiet",
            "--methods", methods, "--per-step", "--output", report,
        )  # fmt: skip
        written = json.loads(report.read_text())
        statuses = {m: row["status"] for m, row in written["methods"].items()}
        if kind == "bart":
            assert code == 0, err
            assert set(statuses.values()) == {"ok"}
            assert np.shape(written["examples"][0]["steps"]["cross-gae"]) == (2, 4)
        else:
            assert code == 3
            assert statuses.pop("random") == "ok"
            assert set(statuses.values()) == {
                "explains seq2seq language models, not this causal one"
            }
            assert "segment method cross-gae is skipped" in err
