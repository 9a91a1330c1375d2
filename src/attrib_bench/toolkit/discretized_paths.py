"""Discretized Integrated Gradients' paths (docs/math/discretized-ig.md): from a baseline
word's embedding to an input word's through anchor words of the vocabulary, each point made
monotonic between the two, as the official code builds them (github.com/INK-USC/DIG,
``monotonic_paths.py``; its ``knn.py`` for the neighbour graph).

The neighbour graph is the k nearest other words of the embedding matrix by Euclidean distance,
nearest first (scikit-learn's ``kneighbors_graph(W, k, mode="distance")`` in the official code;
here computed exactly, row by row on demand and kept per matrix, since a run visits a few
thousand of a vocabulary's words). k is capped at the vocabulary's size minus one.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import torch
from torch import nn

#: Per embedding module: its matrix and squared norms (in the weight's dtype, as the official
#: code's scikit-learn graph on the float32 matrix), and the neighbour rows computed so far
#: (word -> its k nearest), valid while the weight's storage and version are the same.
_MEMO: WeakKeyDictionary[nn.Module, dict] = WeakKeyDictionary()


def _memo(lookup: nn.Module, k: int) -> dict:
    weight = lookup.weight
    stamp = (weight.data_ptr(), weight.dtype, weight._version, k)
    memo = _MEMO.get(lookup)
    if memo is None or memo["stamp"] != stamp:
        words = weight.detach()
        memo = {"stamp": stamp, "words": words, "norms": words.pow(2).sum(dim=-1), "rows": {}}
        _MEMO[lookup] = memo
    return memo


def neighbours(lookup: nn.Module, words: list[int], k: int) -> list[torch.Tensor]:
    """Each word's ``k`` nearest other words in the embedding matrix ``lookup.weight`` by
    Euclidean distance, nearest first (k capped at the vocabulary's size minus one); the rows
    not yet known in one product, memoised per module."""
    memo = _memo(lookup, k)
    rows = memo["rows"]
    missing = sorted({w for w in words if w not in rows})
    if missing:
        matrix_VD, norms_V = memo["words"], memo["norms"]
        index = torch.tensor(missing, device=matrix_VD.device)
        squared_MV = norms_V[index, None] - 2 * matrix_VD[index] @ matrix_VD.T + norms_V[None]
        squared_MV[torch.arange(len(missing)), index] = torch.inf
        count = min(k, matrix_VD.shape[0] - 1)
        nearest = torch.topk(squared_MV, count, dim=-1, largest=False, sorted=True).indices
        rows.update(zip(missing, nearest.cpu(), strict=True))
    return [rows[w] for w in words]


def monotonic(baseline_D: torch.Tensor, end_D: torch.Tensor, points_CD: torch.Tensor):
    """Per dimension, whether each point lies between ``baseline`` and ``end`` (equal to both
    where they are equal): the official ``monotonic(..., ret='vec')``, (C, D), as one interval
    test."""
    return (points_CD >= torch.minimum(baseline_D, end_D)) & (
        points_CD <= torch.maximum(baseline_D, end_D)
    )


def made_monotonic(
    baseline_D: torch.Tensor, end_D: torch.Tensor, points_CD: torch.Tensor, steps: int
) -> torch.Tensor:
    """Each point with its non-monotonic dimensions moved to end - (end - baseline) / steps:
    the official ``make_monotonic_vec``."""
    step_D = end_D - (end_D - baseline_D) / steps
    return torch.where(monotonic(baseline_D, end_D, points_CD), points_CD, step_D)


#: Paths whose candidate anchors are scored in one tensor, (tokens, k, D): bounds memory.
_TOKENS_AT_ONCE = 32


def next_anchors(
    words_VD: torch.Tensor,
    near_PK: torch.Tensor,
    baselines: list[int],
    paths: list[list[int]],
    strategy: str,
    steps: int,
) -> list[int]:
    """The official ``find_next_wrd`` for each path's last word, its neighbours ``near_PK``:
    among them, other than the baseline and the path's words, the one closest to its monotonic
    version (``greedy``) or with the fewest non-monotonic dimensions (``maxcount``); ties to the
    nearer neighbour. The baseline when none is left, or when the last word is the baseline.
    Scored for up to ``_TOKENS_AT_ONCE`` paths in one tensor."""
    out = []
    for start in range(0, len(paths), _TOKENS_AT_ONCE):
        chunk = slice(start, start + _TOKENS_AT_ONCE)
        near = near_PK[chunk]
        lasts = torch.tensor([path[-1] for path in paths[chunk]])
        bases = torch.tensor(baselines[chunk])
        points_PKD = words_VD[near]
        base_P1D, end_P1D = words_VD[bases][:, None], words_VD[lasts][:, None]
        if strategy == "greedy":
            moved = made_monotonic(base_P1D, end_P1D, points_PKD, steps)
            key_PK = (points_PKD - moved).norm(dim=-1)
        else:
            key_PK = -monotonic(base_P1D, end_P1D, points_PKD).sum(dim=-1).to(words_VD.dtype)
        order_PK = torch.sort(key_PK, dim=-1, stable=True).indices
        for row, path in enumerate(paths[chunk]):
            base = int(bases[row])
            chosen = base
            if path[-1] != base:
                taken = {*path, base}
                candidates = near[row, order_PK[row]].tolist()
                chosen = next((j for j in candidates if j not in taken), base)
            out.append(chosen)
    return out


def word_paths(
    lookup: nn.Module,
    words: list[int],
    baselines: list[int],
    steps: int,
    strategy: str,
    k: int,
) -> list[list[int]]:
    """The official ``find_word_path`` of each word of the embedding module ``lookup``: itself
    and ``steps`` anchors towards its baseline; the paths advance together, so each step's new
    neighbour rows are one product and its candidates one tensor."""
    words_VD = lookup.weight.detach()
    paths = [[word] for word in words]
    for _ in range(steps):
        near_PK = torch.stack(neighbours(lookup, [path[-1] for path in paths], k))
        for path, anchor in zip(
            paths, next_anchors(words_VD, near_PK, baselines, paths, strategy, steps), strict=True
        ):
            path.append(anchor)
    return paths


def monotonic_path(
    words_VD: torch.Tensor, path: list[int], baseline: int, steps: int, upscale: int
) -> torch.Tensor:
    """The official ``make_monotonic_path``: the points (P, D) from the baseline's embedding to
    the input word's, each anchor made monotonic with respect to the baseline and the point
    before it; ``upscale`` times a midpoint inserted between consecutive points."""
    baseline_D = words_VD[baseline]
    points = [words_VD[path[0]]]
    for anchor in path[1:]:
        points.append(made_monotonic(baseline_D, points[-1], words_VD[anchor][None], steps)[0])
    points.append(baseline_D)
    path_PD = torch.stack(points[::-1])
    for _ in range(upscale):
        middle = (path_PD[:-1] + path_PD[1:]) / 2
        both = torch.empty(2 * len(path_PD) - 1, path_PD.shape[1], dtype=path_PD.dtype)
        both[0::2], both[1::2] = path_PD, middle
        path_PD = both
    return path_PD
