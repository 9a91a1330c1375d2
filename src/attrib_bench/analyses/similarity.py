"""Representation similarity between models, layer pair by layer pair (issue 12, first step).

``attrib-bench similarity``: for models x and y, on the same sentences, per layer pair (i, j)
(index 0 = the embedding output, ``hidden_states[0]``): linear CKA (biased HSIC as Kornblith et
al.'s code; debiased HSIC as an option), RBF CKA, SVCCA, PWCCA, the orthogonal Procrustes
distance, the linear-regression R^2 of y's features from x's, and learned alignment maps
(``attrib_bench.analyses.alignment``: linear, MLP, INN) scored by MSE and R^2 on held-out
sentences. Every model also gets a floor: the same measures against a randomly initialised model
of its architecture, and between two randomly initialised ones, because random networks can look
alike (docs/math/similarity.md, "The floor").

The measures are pure functions of two matrices X (n, d1), Y (n, d2) whose rows are the same
sentences (or tokens). Features are taken in eval mode and averaged over real tokens only.

Memory: biased linear CKA, SVCCA, PWCCA, Procrustes and the regression work in feature space
(d x d matrices, never n x n), whatever n. RBF CKA and debiased linear CKA need n x n Gram
matrices, so above ``max_gram_rows`` rows (token-level runs reach tens of thousands) they are
computed on a seeded random subset of the rows, the same rows for x and y (``gram_rows``), and the
report says so (``gram_subsample``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import scipy.linalg
import torch

from attrib_bench.core import console
from attrib_bench.core.architecture_spec import ArchitectureSpec
from attrib_bench.core.errors import UsageError, unknown_choice

MEASURES = ("linear_cka", "rbf_cka", "svcca", "pwcca", "procrustes", "linreg_r2")
LEARNED_MAPS = ("linear", "mlp", "inn")
#: Also fitted when ``--maps`` names them: the released BERT-INN (its own start and schedule).
NAMED_MAPS = (*LEARNED_MAPS, "bert-inn")
TRAIN_SHARE = 0.7
GRAM_MEASURES = ("rbf_cka", "linear_cka_debiased")  # the measures that build n x n Grams
# An n x n float64 Gram is 8 n^2 bytes: 128 MB at 4000 rows. RBF CKA holds about eight such
# matrices at its peak (x and y: products, distances, kernels, centred copies, their product),
# about 1 GB; uncapped, 25,000 token rows would be 5 GB per matrix.
MAX_GRAM_ROWS = 4000


# --- measures: pure functions of X (n, d1), Y (n, d2), float64 ------------------------------


def _centred(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x - x.mean(axis=0, keepdims=True)


def _check(x: np.ndarray, y: np.ndarray) -> None:
    if x.ndim != 2 or y.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"need X (n, d1) and Y (n, d2) with the same rows: {x.shape}, {y.shape}")
    if x.shape[0] < 2:
        raise ValueError("need at least 2 rows")


def _cka_from_grams(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    """Biased HSIC CKA of two centred Gram matrices: <K, L> / (||K|| ||L||)."""
    denominator = np.linalg.norm(k) * np.linalg.norm(l)
    return float(np.sum(k * l) / denominator) if denominator > 0 else float("nan")


def _centre_gram(k: np.ndarray) -> np.ndarray:
    return k - k.mean(axis=0, keepdims=True) - k.mean(axis=1, keepdims=True) + k.mean()


def _unbiased_hsic(k: np.ndarray, l: np.ndarray) -> float:  # noqa: E741
    """Song et al. (2012) unbiased HSIC estimator (up to a constant that cancels in CKA)."""
    n = k.shape[0]
    k = k.copy()
    l = l.copy()  # noqa: E741
    np.fill_diagonal(k, 0.0)
    np.fill_diagonal(l, 0.0)
    ones_k, ones_l = k.sum(axis=0), l.sum(axis=0)
    value = (
        np.sum(k * l)
        + ones_k.sum() * ones_l.sum() / ((n - 1) * (n - 2))
        - 2.0 * ones_k @ ones_l / (n - 2)
    )
    return float(value / (n * (n - 3)))


def linear_cka(x: np.ndarray, y: np.ndarray, debiased: bool = False) -> float:
    """Linear CKA (Kornblith et al. 2019).

    Biased (their code's default): ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F) on centred
    features, the feature-space form of <Kc, Lc> / (||Kc|| ||Lc||) with K = Xc Xc^T: only d x d
    matrices, so any number of rows. ``debiased``: the unbiased HSIC of Song et al. 2012 (as in
    Nguyen et al. 2021) on the linear n x n Gram matrices; needs n >= 4.
    """
    _check(x, y)
    xc, yc = _centred(x), _centred(y)
    if debiased:
        if x.shape[0] < 4:
            raise ValueError("debiased CKA needs at least 4 rows")
        k, l = xc @ xc.T, yc @ yc.T  # noqa: E741
        product = _unbiased_hsic(k, l)
        norms = _unbiased_hsic(k, k) * _unbiased_hsic(l, l)
        return float(product / np.sqrt(norms)) if norms > 0 else float("nan")
    cross = np.linalg.norm(yc.T @ xc) ** 2
    denominator = np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc)
    return float(cross / denominator) if denominator > 0 else float("nan")


def rbf_gram(x: np.ndarray, threshold: float = 1.0) -> np.ndarray:
    """Kornblith's ``gram_rbf``: exp(-d_ij^2 / (2 sigma^2)), sigma = threshold x the square root
    of the median squared distance (over all n^2 entries, as their code)."""
    x = np.asarray(x, dtype=np.float64)
    dot = x @ x.T
    squared = np.diag(dot)
    distances = np.maximum(squared[:, None] + squared[None, :] - 2 * dot, 0.0)
    median = np.median(distances)
    if median <= 0:
        return np.ones_like(distances)
    return np.exp(-distances / (2 * threshold**2 * median))


def rbf_cka(x: np.ndarray, y: np.ndarray, threshold: float = 1.0) -> float:
    """RBF-kernel CKA (biased HSIC), bandwidth ``threshold`` x the median distance."""
    _check(x, y)
    return _cka_from_grams(
        _centre_gram(rbf_gram(x, threshold)), _centre_gram(rbf_gram(y, threshold))
    )


def _basis(xc: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the column space of centred X (SVD, small directions dropped)."""
    return scipy.linalg.orth(xc, rcond=1e-10)


def cca_correlations(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canonical correlations (descending) and X's canonical variates (n, k), orthonormal.

    The correlations are the singular values of Qx^T Qy, Q orthonormal bases of the centred
    features; k = min(rank X, rank Y); none (an undefined score) when rank X + rank Y > n - 1, where
    that many correlations would be 1 whatever the features.
    """
    qx, qy = _basis(_centred(x)), _basis(_centred(y))
    if qx.shape[1] + qy.shape[1] > x.shape[0] - 1:
        # Centred, the n rows span n - 1 dimensions: two subspaces whose ranks add up to more
        # meet, and that many correlations are 1 whatever the models (an undefined score).
        return np.array([]), np.zeros((x.shape[0], 0))
    u, s, _ = scipy.linalg.svd(qx.T @ qy, full_matrices=False)
    k = min(qx.shape[1], qy.shape[1])
    return np.clip(s[:k], 0.0, 1.0), qx @ u[:, :k]


def svd_reduce(x: np.ndarray, keep: float = 0.9) -> np.ndarray:
    """Centred X on its top singular directions whose singular values sum to ``keep`` of the
    total (the official SVCCA code's rule: singular values, not variances)."""
    xc = _centred(x)
    u, s, _ = scipy.linalg.svd(xc, full_matrices=False)
    if s.sum() <= 0:
        return xc[:, :1]
    count = int(np.searchsorted(np.cumsum(s) / s.sum(), keep - 1e-12) + 1)
    count = min(count, len(s))
    return u[:, :count] * s[:count]


def svcca(x: np.ndarray, y: np.ndarray, keep: float = 0.9) -> float:
    """SVCCA (Raghu et al. 2017): SVD-reduce both, then the mean canonical correlation."""
    _check(x, y)
    correlations, _ = cca_correlations(svd_reduce(x, keep), svd_reduce(y, keep))
    return float(correlations.mean()) if len(correlations) else float("nan")


#: ``ours``: eq. (2) of docs/math/similarity.md; ``google``: google/svcca's ``compute_pwcca``.
PWCCA_CONVENTIONS = ("ours", "google")


def pwcca(x: np.ndarray, y: np.ndarray, convention: str = "ours") -> float:
    """PWCCA (Morcos et al. 2018): canonical correlations weighted by alpha_i = sum_j
    |<h_i, x_j>|, h_i X's orthonormal canonical variates, x_j the centred columns of X.
    ``convention="google"``: the official code's weights instead (``pwcca_google``)."""
    _check(x, y)
    if convention == "google":
        return pwcca_google(x, y)
    if convention != "ours":
        raise ValueError(f"convention must be one of {PWCCA_CONVENTIONS}, got {convention!r}")
    correlations, variates = cca_correlations(x, y)
    weights = np.abs(variates.T @ _centred(x)).sum(axis=1)
    if not len(correlations) or weights.sum() <= 0:
        return float("nan")
    return float(np.sum(weights / weights.sum() * correlations))


def _inverse_sqrt(s: np.ndarray) -> np.ndarray:
    """S^-1/2 as the official code takes it: the symmetric square root of S's pseudo-inverse."""
    values, vectors = np.linalg.eigh(np.linalg.pinv(s))
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def pwcca_google(x: np.ndarray, y: np.ndarray) -> float:
    """google/svcca's ``compute_pwcca`` (docs/math/similarity.md, "PWCCA as google/svcca
    computes it"): on the narrower model's side X, the left singular vectors U of
    Sxx^-1/2 Sxy Syy^-1/2 (sample covariances), directions Xc U with neuron i's mean added to
    direction i, orthonormalised by QR; weights a_i = sum_j |<p_i, x_j>| over X's raw
    (uncentred) columns; sum_i a_i rho_i / sum_i a_i. NaN unless d_x < n (the code asserts it).
    With non-zero means the score depends on the SVD's signs, which numpy's LAPACK fixes."""
    if x.shape[1] > y.shape[1]:  # the official code indexes the wrong array here: its intent
        x, y = y, x
    n, d = x.shape
    if d >= n:
        return float("nan")
    covariance = np.cov(np.hstack([x, y]).T)
    sxx, sxy, syy = covariance[:d, :d], covariance[:d, d:], covariance[d:, d:]
    u, correlations, _ = np.linalg.svd(_inverse_sqrt(sxx) @ sxy @ _inverse_sqrt(syy))
    mean = x.mean(axis=0)
    directions, _ = np.linalg.qr((x - mean) @ u + mean)
    weights = np.abs(directions.T @ x).sum(axis=1)
    return float(np.sum(weights / weights.sum() * np.abs(correlations[:d])))


def procrustes_distance(x: np.ndarray, y: np.ndarray) -> float:
    """Orthogonal Procrustes distance (Ding et al. 2021): with X, Y centred and scaled to unit
    Frobenius norm, ||X||_F^2 + ||Y||_F^2 - 2||X^T Y||_* = 2 - 2||X^T Y||_*, in [0, 2].

    The nuclear norm is ``scipy.linalg.orthogonal_procrustes``' scale (the narrower matrix padded
    with zero columns, which leaves it unchanged).
    """
    _check(x, y)
    xc, yc = _centred(x), _centred(y)
    nx, ny = np.linalg.norm(xc), np.linalg.norm(yc)
    if nx == 0 or ny == 0:
        return float("nan")
    xc, yc = xc / nx, yc / ny
    width = max(xc.shape[1], yc.shape[1])
    xc = np.pad(xc, ((0, 0), (0, width - xc.shape[1])))
    yc = np.pad(yc, ((0, 0), (0, width - yc.shape[1])))
    _, nuclear = scipy.linalg.orthogonal_procrustes(xc, yc)
    return float(max(2.0 - 2.0 * nuclear, 0.0))


def linreg_r2(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    ridge: float = 1e-3,
) -> float:
    """R^2 of Y from X by least squares with an intercept, fitted on the train rows, scored on
    the test rows: 1 - sum (Y - Yhat)^2 / sum (Y - mean_test Y)^2 over all outputs (pooled).

    Ordinary least squares (``scipy.linalg.lstsq``) when the train rows outnumber X's width;
    otherwise ridge with lambda = ``ridge`` x trace(Xc^T Xc) / d1 (relative to the features'
    scale), as plain least squares would interpolate the train rows.
    """
    _check(x_train, y_train)
    _check(x_test, y_test)
    mean_x, mean_y = x_train.mean(axis=0), y_train.mean(axis=0)
    xc, yc = x_train - mean_x, y_train - mean_y
    if x_train.shape[0] > x_train.shape[1]:
        weights = scipy.linalg.lstsq(xc, yc)[0]
    else:
        scale = ridge * np.trace(xc.T @ xc) / xc.shape[1]
        # dual form: W = Xc^T (Xc Xc^T + lambda I)^-1 Yc (n x n, n < d)
        gram = xc @ xc.T + scale * np.eye(xc.shape[0])
        weights = xc.T @ scipy.linalg.solve(gram, yc, assume_a="pos")
    predicted = (x_test - mean_x) @ weights + mean_y
    total = np.sum((y_test - y_test.mean(axis=0)) ** 2)
    if total <= 0:
        return float("nan")
    return float(1.0 - np.sum((y_test - predicted) ** 2) / total)


# --- features --------------------------------------------------------------------------------


@dataclass
class SimilarityConfig:
    models: list[str]
    dataset: str | None = None
    split: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    limit: int | None = None
    max_length: int = 128
    token_level: bool = False
    all_pairs: bool = False
    learned: bool = True
    #: Only the learned maps (``--maps-only``): the closed-form measures (``MEASURES``) are
    #: skipped, and so is every layer pair no map is fitted on; for a second run of maps beside
    #: a report that already holds those measures.
    maps_only: bool = False
    #: The learned maps to fit; None: every one of LEARNED_MAPS whose package is installed
    #: (``inn`` is skipped without FrEIA, see ``resolve_maps``).
    maps: list[str] | None = None
    #: The learned maps fitted on the random-init floors' pairs, a subset of ``maps``; None:
    #: ``maps``; empty: none (with ``maps_only``, the floors' pairs are then skipped whole).
    floor_maps: list[str] | None = None
    #: The most epochs a learned map trains (early stopping may end it sooner); ``bert-inn``
    #: keeps its released schedule. Each fit at (i, i) costs per epoch, so this is the budget.
    map_epochs: int = 300
    debiased: bool = False
    rbf_threshold: float = 1.0
    svcca_keep: float = 0.9
    #: ``ours`` (eq. (2)) or ``google`` (google/svcca's weights, ``pwcca_google``).
    pwcca_convention: str = "ours"
    seed: int = 0
    device: str = "auto"
    max_gram_rows: int | None = MAX_GRAM_ROWS  # None: no cap
    measures: list[str] = field(default_factory=list)


@dataclass
class Features:
    """One model's features: per layer (L + 1) a float64 matrix whose rows are the sentences
    (or, token-level, every real token of every sentence in order); ``rows_per_sentence`` maps
    rows back to sentences for the train/test split; ``input_ids`` per sentence."""

    layers: list[np.ndarray]
    rows_per_sentence: list[int]
    input_ids: list[list[int]]


@torch.no_grad()
def extract_features(model, tokenizer, examples, device, max_length: int, token_level: bool):
    """Hidden states (``output_hidden_states=True``) in eval mode, pooled over real tokens."""
    from attrib_bench.data.batches import make_batches

    model.eval()
    batches, truncated = make_batches(examples, tokenizer, 32, max_length)
    if truncated:
        console.warn(f"{truncated} inputs truncated to {max_length} tokens")
    position = {id(e): i for i, e in enumerate(examples)}
    per_sentence: list = [None] * len(examples)
    for batch in batches:
        inputs = {k: v.to(device) for k, v in batch.model_inputs().items()}
        with torch.no_grad():  # features only: no autograd graph over every layer
            output = model(**inputs, output_hidden_states=True)
        stacked_BLND = torch.stack(output.hidden_states, dim=1).double().cpu()
        mask_BN = batch.attention_mask_BN.bool()
        for b, example in enumerate(batch.examples):
            states_LND = stacked_BLND[b][:, mask_BN[b]]
            ids = batch.input_ids_BN[b][mask_BN[b]].tolist()
            vectors = states_LND if token_level else states_LND.mean(dim=1, keepdim=True)
            per_sentence[position[id(example)]] = (vectors, ids)
    layers = [
        torch.cat([v[layer] for v, _ in per_sentence]).numpy()
        for layer in range(per_sentence[0][0].shape[0])
    ]
    return Features(
        layers=layers,
        rows_per_sentence=[v.shape[1] for v, _ in per_sentence],
        input_ids=[ids for _, ids in per_sentence],
    )


def random_model(loaded, seed: int):
    """A randomly initialised model of the same architecture (``AutoModel.from_config``)."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_config(loaded.model.config)
    return model.to(loaded.device).eval()


def split_rows(rows_per_sentence: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train/test row indices from a seeded 70/30 split of the sentences."""
    order = list(range(len(rows_per_sentence)))
    random.Random(seed).shuffle(order)
    cut = max(1, min(len(order) - 1, round(TRAIN_SHARE * len(order))))
    starts = np.concatenate([[0], np.cumsum(rows_per_sentence)])
    rows = [np.arange(starts[s], starts[s + 1]) for s in range(len(order))]
    return (
        np.concatenate([rows[s] for s in sorted(order[:cut])]),
        np.concatenate([rows[s] for s in sorted(order[cut:])]),
    )


def gram_rows(n: int, cap: int | None, seed: int) -> np.ndarray | None:
    """The rows (sorted indices) on which the n x n Gram measures are computed when n exceeds
    ``cap``: ``cap`` of the n rows drawn without replacement by ``numpy.random.default_rng(seed)``;
    None (every row) when n <= cap or there is no cap. One subset serves x and y (rows are
    paired) and every layer pair."""
    if cap is None or n <= cap:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, size=cap, replace=False))


def gram_subsample(n: int, config: SimilarityConfig) -> dict | None:
    """The report's record of the subsampling (None when every row is used)."""
    rows = gram_rows(n, config.max_gram_rows, config.seed)
    measures = [m for m in GRAM_MEASURES if m in measure_names(config)]
    if rows is None or not measures:
        return None
    return {
        "rows": len(rows),
        "of": n,
        "measures": measures,
        "seed": config.seed,
        "rule": "numpy.random.default_rng(seed).choice(of, rows, replace=False), sorted",
    }


# --- the analysis ----------------------------------------------------------------------------


def measure_names(config: SimilarityConfig) -> list[str]:
    names = [] if config.maps_only else list(MEASURES)
    if config.debiased and not config.maps_only:
        names.insert(1, "linear_cka_debiased")
    if config.learned:
        names += [f"{m}_{metric}" for m in _maps(config) for metric in ("mse", "r2")]
    return names


def _maps(config: SimilarityConfig) -> tuple[str, ...]:
    return LEARNED_MAPS if config.maps is None else tuple(config.maps)


def _pair_maps(config: SimilarityConfig, kind: str) -> tuple[str, ...]:
    """The learned maps fitted on a pair of this kind (``models`` or a floor's)."""
    if not config.learned:
        return ()
    if kind == "models" or config.floor_maps is None:
        return _maps(config)
    return tuple(name for name in _maps(config) if name in config.floor_maps)


def _fit_alignments():
    try:
        from attrib_bench.analyses.alignment import fit_alignments
    except ImportError as error:
        raise UsageError(
            f"the learned alignment maps need attrib_bench.analyses.alignment ({error}); "
            "pass --no-learned to skip them"
        ) from None
    return fit_alignments


def resolve_maps(config: SimilarityConfig) -> dict[str, str]:
    """Set ``config.maps`` to the learned maps that will run, before the slow part, and return
    the default maps skipped with why: the default set drops ``inn`` without FrEIA (one
    warning) so that the other measures still run, while a map asked for by name must run (its
    missing package is one line, exit 2)."""
    if not config.learned:
        for option, value in (("--maps", config.maps), ("--floor-maps", config.floor_maps)):
            if value is not None:
                raise UsageError(
                    f"{option} chooses learned maps, which --no-learned skips: give one"
                )
        return {}
    _fit_alignments()  # the alignment module imports
    from attrib_bench.analyses.alignment import import_freia

    if config.maps is not None:
        if not config.maps:
            raise UsageError(f"--maps needs at least one of {', '.join(LEARNED_MAPS)}")
        for name in config.maps:
            if name not in NAMED_MAPS:
                raise unknown_choice("alignment map", name, NAMED_MAPS)
        if "inn" in config.maps:
            import_freia()
        _check_floor_maps(config)
        return {}
    skipped = {}
    try:
        import_freia()
    except UsageError as error:
        skipped["inn"] = str(error)
        console.warn(f"{error}; the 'inn' map is skipped, the other maps and measures run")
    config.maps = [name for name in LEARNED_MAPS if name not in skipped]
    _check_floor_maps(config)
    return skipped


def _check_floor_maps(config: SimilarityConfig) -> None:
    for name in config.floor_maps or ():
        if name not in config.maps:
            raise UsageError(
                f"--floor-maps names {name!r}, which is not among the maps fitted "
                f"({', '.join(config.maps)}): the floors' maps are a subset of --maps"
            )


def compare(
    fx: Features, fy: Features, config: SimilarityConfig, bar=None, task=None, maps=None
) -> tuple[dict, dict, dict]:
    """Every measure for every layer pair (i, j): matrices of L_x + 1 rows of L_y + 1 values,
    None where not computed (with ``maps_only``, every pair no map is fitted on). x -> y is a
    direction (regression, maps): never mirrored. ``maps``: the learned maps fitted for this
    pair (default ``config``'s). Also the learned maps' intervals: per ``{map}_{mse|r2}``, and
    per ``{map}_mse_minus_{first map}`` for every map after the first (paired: its MSE minus
    the first map's), a matrix of bootstrap 95% intervals [low, high] over the held-out
    sentences, None where not fitted. And the starts: ``{"inn": matrix}`` of where the INN
    began (``alignment.INN_STARTS``), None where not fitted; empty without the INN. And the
    epochs: per early-stopped map (all but ``bert-inn``) a matrix of [epochs trained, epoch
    kept] (0: its start), None where not fitted."""
    names = measure_names(config)
    maps = _maps(config) if maps is None else maps
    fit = _fit_alignments() if config.learned else None
    train, test = split_rows(fx.rows_per_sentence, config.seed)
    sentence_of_row = np.repeat(np.arange(len(fx.rows_per_sentence)), fx.rows_per_sentence)
    subset = gram_rows(sum(fx.rows_per_sentence), config.max_gram_rows, config.seed)
    rows, columns = len(fx.layers), len(fy.layers)

    def matrices(keys) -> dict[str, list[list]]:
        return {key: [[None] * columns for _ in range(rows)] for key in keys}

    named = maps if config.learned else ()
    keys = [f"{name}_{metric}" for name in named for metric in ("mse", "r2")]
    keys += [f"{name}_mse_minus_{maps[0]}" for name in named[1:]]
    result, intervals = matrices(names), matrices(keys)
    starts = matrices(name for name in named if name == "inn")
    epochs = matrices(name for name in named if name != "bert-inn")
    fitted_pairs = [
        (i, j) for i in range(rows) for j in range(columns) if config.all_pairs or i == j
    ]
    released = {}
    if fit is not None and "bert-inn" in maps:
        released["bert-inn"] = _released(fx, fy, fitted_pairs, train, config.seed, bar)
    for i, x in enumerate(fx.layers):
        for j, y in enumerate(fy.layers):
            fitted = (i, j) in fitted_pairs and bool(maps)
            if config.maps_only and not fitted:
                continue
            values = {} if config.maps_only else _closed_form(x, y, train, test, subset, config)
            if fit is not None and fitted:
                learned = fit(
                    torch.from_numpy(x[train]).float(),
                    torch.from_numpy(y[train]).float(),
                    torch.from_numpy(x[test]).float(),
                    torch.from_numpy(y[test]).float(),
                    seed=config.seed,
                    maps=maps,
                    max_epochs=config.map_epochs,
                    test_groups=sentence_of_row[test],
                    fitted=released,
                )
                for name, scores in learned.items():
                    for metric in ("mse", "r2"):
                        if f"{name}_{metric}" in result and metric in scores:
                            values[f"{name}_{metric}"] = float(scores[metric])
                    for key, interval in scores.items():
                        if key.endswith("_ci95") and f"{name}_{key[:-5]}" in intervals:
                            intervals[f"{name}_{key[:-5]}"][i][j] = interval
                    if name in starts:
                        starts[name][i][j] = scores["start"]
                    if name in epochs:
                        epochs[name][i][j] = [scores["epochs"], scores["best_epoch"]]
            for name, value in values.items():
                result[name][i][j] = None if value is None or np.isnan(value) else value
            if bar is not None:
                bar.advance(task)
    return result, intervals, starts, epochs


def _released(
    fx: Features,
    fy: Features,
    fitted_pairs: list[tuple[int, int]],
    train: np.ndarray,
    seed: int,
    bar=None,
) -> torch.nn.Module:
    """The released BERT-INN: one map for every layer pair fitted, as the official code trains
    one for all layers (docs/math/similarity.md); its batches show as a task of ``bar``."""
    from attrib_bench.analyses.alignment import fit_released
    from attrib_bench.analyses.bert_inn import STEPS

    on_batch = None
    if bar is not None:
        task = bar.add_task(f"bert-inn batches ({len(fitted_pairs)} layer pairs)", total=STEPS)
        on_batch = lambda: bar.advance(task)  # noqa: E731
    rows = [(fx.layers[i][train], fy.layers[j][train]) for i, j in fitted_pairs]
    pairs = [(torch.from_numpy(x).float(), torch.from_numpy(y).float()) for x, y in rows]
    return fit_released(pairs, seed, on_batch=on_batch)


def _closed_form(
    x: np.ndarray,
    y: np.ndarray,
    train: np.ndarray,
    test: np.ndarray,
    subset: np.ndarray | None,
    config: SimilarityConfig,
) -> dict[str, float]:
    """The closed-form measures (``MEASURES``, and debiased CKA when asked) of one layer pair."""
    xg, yg = (x, y) if subset is None else (x[subset], y[subset])
    values = {
        "linear_cka": linear_cka(x, y),
        "rbf_cka": rbf_cka(xg, yg, config.rbf_threshold),
        "svcca": svcca(x, y, config.svcca_keep),
        "pwcca": pwcca(x, y, config.pwcca_convention),
        "procrustes": procrustes_distance(x, y),
        "linreg_r2": linreg_r2(x[train], y[train], x[test], y[test]),
    }
    if config.debiased:
        values["linear_cka_debiased"] = linear_cka(xg, yg, debiased=True)
    return values


def _layer_pairs(fx: Features, fy: Features, config: SimilarityConfig, maps: list[str]) -> int:
    """The layer pairs ``compare`` computes: all of them, or with ``maps_only`` those fitted
    (none where no map is)."""
    rows, columns = len(fx.layers), len(fy.layers)
    if config.maps_only and not maps:
        return 0
    if config.maps_only and not config.all_pairs:
        return min(rows, columns)
    return rows * columns


def random_representatives(loaded: dict) -> dict[str, str]:
    """Model name -> the first model of the same architecture (config, names and paths
    aside): seed models share one random init, so its features and its random-random pair
    are computed once, not once per seed."""
    first: dict[str, str] = {}
    out = {}
    for name, model in loaded.items():
        config = model.model.config.to_dict()
        config.pop("transformers_version", None)
        shape = {k: v for k, v in config.items() if not k.startswith("_")}
        key = json.dumps(shape, sort_keys=True, default=str)
        out[name] = first.setdefault(key, name)
    return out


def _unequal_widths(
    fx: Features, fy: Features, x: str, y: str, config: SimilarityConfig, asked: bool
) -> dict[str, str]:
    """``{"inn": why}`` when the pair's widths differ and the INN is among the maps (an
    invertible map needs equal widths): the default maps skip it for this pair with a warning,
    ``--maps`` naming it is a UsageError."""
    dx, dy = fx.layers[0].shape[1], fy.layers[0].shape[1]
    bijective = [m for m in ("inn", "bert-inn") if m in _maps(config)]
    if not config.learned or not bijective or dx == dy:
        return {}
    named = " and ".join(bijective)
    why = f"the {named} map needs equal widths (an invertible map): {x} has {dx}, {y} {dy}"
    if asked:
        raise UsageError(f"{why}; leave {named} out of --maps for models of different widths")
    console.warn(f"{why}; it is skipped for this pair, the other maps and measures run")
    return dict.fromkeys(bijective, why)


def _random_name(model: str, seed: int) -> str:
    return f"random-init:{model}@seed{seed}"


def run_similarity(
    config: SimilarityConfig,
    quiet: bool = False,
    *,
    architectures: Mapping[str, ArchitectureSpec],
) -> dict:
    """Compare the models' representations layer by layer; ``architectures`` are the model
    families known (``Registry.architecture_specs()``)."""
    from attrib_bench.data.load import load_examples
    from attrib_bench.model.load import load_model

    if len(config.models) < 2:
        raise UsageError(
            "--models needs at least 2 comma-separated models (M,M compares a model with itself)"
        )
    if config.map_epochs < 1:
        raise UsageError(f"--map-epochs must be at least 1, got {config.map_epochs}")
    if not 0 < config.svcca_keep <= 1:
        raise UsageError(f"--svcca-keep must be in (0, 1], got {config.svcca_keep}")
    if config.pwcca_convention not in PWCCA_CONVENTIONS:
        raise unknown_choice("PWCCA convention", config.pwcca_convention, PWCCA_CONVENTIONS)
    if config.rbf_threshold <= 0:
        raise UsageError(f"--rbf-threshold must be positive, got {config.rbf_threshold}")
    if config.max_gram_rows is not None and config.max_gram_rows < 4:
        raise UsageError(
            f"--max-gram-rows must be at least 4 (debiased CKA needs 4 rows), or 0 for no cap, "
            f"got {config.max_gram_rows}"
        )
    if config.maps_only and not config.learned:
        raise UsageError("--maps-only keeps only the learned maps, which --no-learned skips")
    asked_maps = config.maps is not None
    skipped_maps = resolve_maps(config)  # fail before the slow part
    data = load_examples(
        config.dataset,
        config.split,
        config.text_column,
        config.text_pair_column,
        None,
        config.limit,
    )
    if len(data.examples) < 4:
        raise UsageError(
            f"similarity needs at least 4 sentences (a train/test split), got {len(data.examples)}"
        )
    config.measures = measure_names(config)
    unique = list(dict.fromkeys(config.models))
    loaded = {
        name: load_model(name, config.device, warn_fresh_head=False, architectures=architectures)
        for name in unique
    }
    features: dict[str, Features] = {}
    random_of = random_representatives(loaded)
    for name, model in loaded.items():
        features[name] = extract_features(
            model.model,
            model.tokenizer,
            data.examples,
            model.device,
            config.max_length,
            config.token_level,
        )
        if random_of[name] != name:
            continue  # the same architecture as a model before it: the same random init
        for seed in (config.seed, config.seed + 1):
            features[_random_name(name, seed)] = extract_features(
                random_model(model, seed),
                model.tokenizer,
                data.examples,
                model.device,
                config.max_length,
                config.token_level,
            )
    if config.token_level:
        reference = features[unique[0]].input_ids
        for name in unique[1:]:
            if features[name].input_ids != reference:
                raise UsageError(
                    f"--token-level needs models that share the tokenizer: {unique[0]!r} and "
                    f"{name!r} tokenise the sentences differently (drop --token-level to compare "
                    "sentence means)"
                )
    plan = [
        (config.models[a], config.models[b], "models")
        for a in range(len(config.models))
        for b in range(a + 1, len(config.models))
    ]
    for name in unique:
        plan.append((name, _random_name(random_of[name], config.seed), "random-floor"))
    for name in dict.fromkeys(random_of.values()):
        plan.append(
            (_random_name(name, config.seed), _random_name(name, config.seed + 1), "random-random")
        )
    unequal = [
        _unequal_widths(features[x], features[y], x, y, config, asked_maps) for x, y, _ in plan
    ]
    fitted_maps = [
        [name for name in _pair_maps(config, kind) if name not in skipped]
        for (_, _, kind), skipped in zip(plan, unequal, strict=True)
    ]
    total = sum(
        _layer_pairs(features[x], features[y], config, maps)
        for (x, y, _), maps in zip(plan, fitted_maps, strict=True)
    )
    pairs = []
    with console.progress(disable=quiet) as bar:
        task = bar.add_task("layer pairs", total=total)
        for (x, y, kind), skipped, maps in zip(plan, unequal, fitted_maps, strict=True):
            measures, intervals, starts, epochs = compare(
                features[x], features[y], config, bar, task, maps
            )
            pairs.append(
                {
                    "x": x,
                    "y": y,
                    "kind": kind,
                    "measures": measures,
                    "intervals": intervals,
                    "starts": starts,
                    "epochs": epochs,
                    "skipped_maps": skipped,
                }
            )
    return {
        "schema": "attrib-bench/similarity",
        "version": 1,
        "config": asdict(config),
        "dataset": {
            "name": data.name,
            "split": data.split,
            "fingerprint": data.fingerprint,
            "sentences": len(data.examples),
            "rows": sum(features[unique[0]].rows_per_sentence),
        },
        "gram_subsample": gram_subsample(sum(features[unique[0]].rows_per_sentence), config),
        "skipped_maps": skipped_maps,
        "models": [
            {
                "name": name,
                "id": model.model_id,
                "weights_sha256": model.weights_sha256,
                "model_type": model.model.config.model_type,
                "layers": len(features[name].layers) - 1,
                "width": int(features[name].layers[0].shape[1]),
            }
            for name, model in loaded.items()
        ],
        "pairs": pairs,
    }


def plot_pairs(report: dict, directory: Path) -> list[Path]:
    """A heatmap PNG per pair and measure (matplotlib, optional: attrib-bench[plot])."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "--plots draws heatmaps with matplotlib: pip install 'attrib-bench[plot]'"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for index, pair in enumerate(report["pairs"]):
        for name, matrix in pair["measures"].items():
            values = np.array(
                [[np.nan if v is None else v for v in row] for row in matrix], dtype=float
            )
            figure, axis = plt.subplots(figsize=(4.6, 4))
            image = axis.imshow(values, origin="lower", cmap="viridis")
            figure.colorbar(image, ax=axis)
            axis.set_xlabel(f"layer of {Path(pair['y']).name} (0 = embeddings)", fontsize=7)
            axis.set_ylabel(f"layer of {Path(pair['x']).name}", fontsize=7)
            axis.set_title(f"{name} ({pair['kind']})", fontsize=9)
            figure.tight_layout()
            path = directory / f"pair{index}-{pair['kind']}-{name}.png"
            figure.savefig(path, dpi=100)
            plt.close(figure)
            written.append(path)
    return written
