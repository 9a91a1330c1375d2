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

#: Per embedding module: its matrix in float64 and squared norms, and the neighbour rows computed
#: so far (word -> its k nearest), valid while the weight's storage and version are the same.
_MEMO: WeakKeyDictionary[nn.Module, dict] = WeakKeyDictionary()


def _memo(lookup: nn.Module, k: int) -> dict:
    weight = lookup.weight
    stamp = (weight.data_ptr(), weight.dtype, weight._version, k)
    memo = _MEMO.get(lookup)
    if memo is None or memo["stamp"] != stamp:
        words64 = weight.detach().double()
        memo = {"stamp": stamp, "words": words64, "norms": words64.pow(2).sum(dim=-1), "rows": {}}
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
        words64, norms = memo["words"], memo["norms"]
        index = torch.tensor(missing, device=words64.device)
        squared_MV = norms[index, None] - 2 * words64[index] @ words64.T + norms[None]
        squared_MV[torch.arange(len(missing)), index] = torch.inf
        count = min(k, words64.shape[0] - 1)
        nearest = torch.topk(squared_MV, count, dim=-1, largest=False, sorted=True).indices
        rows.update(zip(missing, nearest.cpu(), strict=True))
    return [rows[w] for w in words]


def monotonic(baseline_D: torch.Tensor, end_D: torch.Tensor, points_CD: torch.Tensor):
    """Per dimension, whether each point lies between ``baseline`` and ``end`` (equal to both
    where they are equal): the official ``monotonic(..., ret='vec')``, (C, D)."""
    above = baseline_D > end_D
    below = baseline_D < end_D
    equal = baseline_D == end_D
    return (
        above & (points_CD <= baseline_D) & (points_CD >= end_D)
        | below & (points_CD >= baseline_D) & (points_CD <= end_D)
        | equal & (points_CD == baseline_D) & (points_CD == end_D)
    )


def made_monotonic(
    baseline_D: torch.Tensor, end_D: torch.Tensor, points_CD: torch.Tensor, steps: int
) -> torch.Tensor:
    """Each point with its non-monotonic dimensions moved to end - (end - baseline) / steps:
    the official ``make_monotonic_vec``."""
    step_D = end_D - (end_D - baseline_D) / steps
    return torch.where(monotonic(baseline_D, end_D, points_CD), points_CD, step_D)


def next_anchor(
    words_VD: torch.Tensor,
    word: int,
    near: torch.Tensor,
    baseline: int,
    path: list[int],
    strategy: str,
    steps: int,
) -> int:
    """The official ``find_next_wrd``: among ``word``'s neighbours ``near`` other than the
    baseline and the path's words, the one closest to its monotonic version (``greedy``) or with
    the fewest non-monotonic dimensions (``maxcount``); ties to the nearer neighbour. The
    baseline when none is left, or when ``word`` is the baseline."""
    if word == baseline:
        return baseline
    candidates = [j for j in near.tolist() if j != baseline]
    if not candidates:
        return baseline
    points_CD = words_VD[candidates]
    if strategy == "greedy":
        moved = made_monotonic(words_VD[baseline], words_VD[word], points_CD, steps)
        key_C = (points_CD - moved).norm(dim=-1)
    else:
        key_C = -monotonic(words_VD[baseline], words_VD[word], points_CD).sum(dim=-1)
    taken = set(path)
    for index in torch.sort(key_C, stable=True).indices.tolist():
        if candidates[index] not in taken:
            return candidates[index]
    return baseline


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
    neighbour rows are one product."""
    words_VD = lookup.weight.detach()
    paths = [[word] for word in words]
    for _ in range(steps):
        near = neighbours(lookup, [path[-1] for path in paths], k)
        for path, base, row in zip(paths, baselines, near, strict=True):
            path.append(next_anchor(words_VD, path[-1], row, base, path, strategy, steps))
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
