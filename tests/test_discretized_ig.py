"""Discretized Integrated Gradients (``discretized-integrated-gradients``): equal to a float64
transcription of the official code (github.com/INK-USC/DIG: ``knn.py``'s scikit-learn neighbour
graph, ``monotonic_paths.py`` loop for loop, ``dig.py``'s sum of gradient times step) with the
model run point by point; the paths are monotonic; the conformance kit; a model without a
vocabulary matrix is one line."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, examples, load_float64, one_batch

from attrib_bench.core.errors import UsageError
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.discretized_paths import monotonic
from attrib_bench_plugins.gradient import DiscretizedIntegratedGradients

sklearn_neighbors = pytest.importorskip("sklearn.neighbors")


class Official:
    """monotonic_paths.py, with its module globals as attributes."""

    def __init__(self, features: np.ndarray, k: int, specials: set[int]) -> None:
        self.features = features
        self.adj = sklearn_neighbors.kneighbors_graph(features, k, mode="distance")
        self.specials = specials

    @staticmethod
    def monotonic(vec1, vec2, vec3, ret="bool"):
        increasing_dims = vec1 > vec2
        decreasing_dims = vec1 < vec2
        equal_dims = vec1 == vec2
        valid = (
            increasing_dims * (vec3 <= vec1) * (vec3 >= vec2)
            + decreasing_dims * (vec3 >= vec1) * (vec3 <= vec2)
            + equal_dims * (vec3 == vec1) * (vec3 == vec2)
        )
        if ret == "count":
            return valid.sum()
        return valid

    def make_monotonic_vec(self, vec1, vec2, vec3, steps):
        mono_dims = self.monotonic(vec1, vec2, vec3, ret="vec")
        non_mono_dims = ~mono_dims
        if non_mono_dims.sum() == 0:
            return vec3
        vec4 = vec3.copy()
        vec4[non_mono_dims] = vec2[non_mono_dims] - (1.0 / steps) * (
            vec2[non_mono_dims] - vec1[non_mono_dims]
        )
        return vec4

    def find_next_wrd(self, wrd_idx, ref_idx, word_path, strategy, steps):
        if wrd_idx == ref_idx:
            return ref_idx
        anchor_map = defaultdict(list)
        cx = self.adj[wrd_idx].tocoo()
        w = self.features
        for j, _v in zip(cx.col, cx.data, strict=True):
            if j == ref_idx:
                continue
            if strategy == "greedy":
                monotonic_vec = self.make_monotonic_vec(w[ref_idx], w[wrd_idx], w[j], steps)
                anchor_map[j] = [np.sqrt(np.sum((w[j] - monotonic_vec) ** 2))]
            else:
                anchor_map[j] = [10000 - self.monotonic(w[ref_idx], w[wrd_idx], w[j], "count")]
        if len(anchor_map) == 0:
            return ref_idx
        sorted_dist_map = dict(sorted(anchor_map.items(), key=lambda item: item[1][0]))
        for key in word_path:
            sorted_dist_map.pop(key, None)
        if len(sorted_dist_map) == 0:
            return ref_idx
        return next(iter(sorted_dist_map))

    def find_word_path(self, wrd_idx, ref_idx, steps, strategy):
        if wrd_idx in self.specials:
            return [wrd_idx] * (steps + 1)
        word_path, last_idx = [wrd_idx], wrd_idx
        for _ in range(steps):
            last_idx = self.find_next_wrd(last_idx, ref_idx, word_path, strategy, steps)
            word_path.append(last_idx)
        return word_path

    def make_monotonic_path(self, word_path_ids, ref_idx, steps):
        monotonic_embs = [self.features[word_path_ids[0]]]
        vec1 = self.features[ref_idx]
        for idx in range(len(word_path_ids) - 1):
            vec2 = monotonic_embs[-1]
            vec3 = self.features[word_path_ids[idx + 1]]
            monotonic_embs.append(self.make_monotonic_vec(vec1, vec2, vec3, steps))
        monotonic_embs.append(vec1)
        monotonic_embs.reverse()
        return np.stack(monotonic_embs)


def official_paths(loaded, k: int) -> Official:
    """The official path finder over the model's vocabulary (its neighbour graph, built once)."""
    features = loaded.model.get_input_embeddings().weight.detach().numpy()
    tokenizer = loaded.tokenizer
    specials = {t for t in (tokenizer.cls_token_id, tokenizer.sep_token_id) if t is not None}
    return Official(features, min(k, features.shape[0] - 1), specials)


def official_row(
    loaded, official: Official, ids_N, ref_N, position, label, steps, strategy
) -> torch.Tensor:
    """One example's DIG row: official paths, then the gradient at each point, one at a time."""
    lookup = loaded.model.get_input_embeddings()
    paths = [
        official.make_monotonic_path(official.find_word_path(w, r, steps, strategy), r, steps)
        for w, r in zip(ids_N.tolist(), ref_N.tolist(), strict=True)
    ]
    scaled = torch.tensor(np.stack(paths, axis=1))  # (points, n, D)
    gradients = []
    for point in scaled:
        x = point[None].clone().requires_grad_()
        handle = lookup.register_forward_hook(lambda *_, x=x: x)
        try:
            logits = loaded.model(input_ids=ids_N[None]).logits[0]
        finally:
            handle.remove()
        logit = logits[position, label] if loaded.is_language_model else logits[label]
        gradients.append(torch.autograd.grad(logit, x)[0][0])
    grads = torch.stack(gradients)
    shifted = torch.cat([scaled[1:], scaled[-1:]])
    return (grads * (shifted - scaled)).sum(dim=0).sum(dim=-1)


@pytest.fixture(scope="module", params=["bert", "gpt2"])
def loaded64(request, tiny_bert, tmp_path_factory):
    return load_float64(request.param, tiny_bert, tmp_path_factory)


@pytest.mark.parametrize(
    "settings",
    [
        {"steps": "6", "neighbours": "40"},
        {"steps": "4", "strategy": "maxcount", "neighbours": "20"},
    ],
    ids=["greedy", "maxcount"],
)
def test_dig_equals_the_official_code(loaded64, settings):
    texts = ["the film was good", "a dull movie", "fine"]
    trace = trace_batch(loaded64, one_batch(loaded64, examples(texts)), frozenset())
    method = DiscretizedIntegratedGradients().configure(settings)
    rows_BN = method.attribute(trace).aggregated_BLN[:, 0]
    pad = loaded64.tokenizer.pad_token_id
    official = official_paths(loaded64, method.params["neighbours"])
    for row in range(len(texts)):
        real_N = trace.batch.attention_mask_BN[row].bool()
        ids_N = trace.batch.input_ids_BN[row][real_N]
        special_N = trace.batch.special_tokens_mask_BN[row][real_N].bool()
        ref_N = torch.where(special_N, ids_N, torch.full_like(ids_N, pad))
        position = int(real_N[: trace.target_positions_B[row]].sum())
        expected = official_row(
            loaded64,
            official,
            ids_N,
            ref_N,
            position,
            int(trace.target_classes_B[row]),
            method.params["steps"],
            method.params["strategy"],
        )
        torch.testing.assert_close(rows_BN[row][real_N].double(), expected, rtol=1e-7, atol=1e-10)


def test_each_point_lies_between_the_baseline_and_the_point_after_it(tiny_bert):
    """The official path's defining property: every point is monotonic between the baseline
    and the next point towards the input."""
    from attrib_bench.toolkit.discretized_paths import monotonic_path, word_paths

    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    lookup = loaded.model.get_input_embeddings()
    words_VD = lookup.weight.detach()
    pad = loaded.tokenizer.pad_token_id
    ids = loaded.tokenizer("a dull movie", add_special_tokens=False)["input_ids"]
    for path in word_paths(lookup, ids, [pad] * len(ids), 8, "greedy", 50):
        points_PD = monotonic_path(words_VD, path, pad, 8, upscale=1)
        assert len(points_PD) == 2 * (8 + 1) + 1
        for before, after in itertools.pairwise(points_PD):
            assert monotonic(points_PD[0], after, before[None]).all()


def test_a_model_without_a_vocabulary_matrix_is_one_line(tiny_bert, monkeypatch):
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    trace = trace_batch(loaded, one_batch(loaded, examples()), frozenset())
    lookup = loaded.model.get_input_embeddings()
    monkeypatch.delattr(lookup, "weight")
    with pytest.raises(UsageError, match=r"^discretized-integrated-gradients: the input embed"):
        DiscretizedIntegratedGradients().attribute(trace)
