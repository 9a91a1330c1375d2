"""Token identifiability and hidden-token analysis (Brunner et al., ICLR 2020).

``attrib-bench identifiability``: for every layer l = 0..L, can the hidden state e_i^l be mapped
back to its own input embedding x_i (the embedding output, ``hidden_states[0]``)? The protocol of
docs/math/identifiability.md, eq. (6): sentence-level K-fold test partitions (or repeated 70/15/15
splits), each fold's other sentences split into training and validation; the naive
baseline (no map) and four learned maps (linear / MLP with 1000 GELU units, trained with an L2 or
a cosine loss: Adam, betas 0.9/0.999, batch 256, Glorot-uniform init, early stopping after
``patience`` epochs without validation improvement, the learning rate chosen on validation loss
from a grid). A token is identified when the nearest candidate to g(e_i^l), under the map's own
distance, is x_i; candidates are the input tokens of the same sentence.

Also the HTA analysis: per layer, the mean own-token contribution c_jj, the share of tokens whose
own input is their top contributor, and the mean contribution by distance |i - j|.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from scipy import stats
from torch import nn

from attrib_bench.core import console
from attrib_bench.core.architecture_spec import ArchitectureSpec
from attrib_bench.core.errors import UsageError
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.toolkit.token_contributions import contributions

LEARNING_RATES = (3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5, 3e-6)
#: ``kfold``: the sentences partitioned into ``folds`` test folds, each used once; ``repeated``:
#: an independent seeded 70/15/15 split per fold (test sets may overlap).
FOLD_SCHEMES = ("kfold", "repeated")
#: The share of a fold's non-test sentences that validates (early stopping, learning rate).
VALIDATION_SHARE = 0.15 / 0.85
MAPS = ("linear-l2", "linear-cosine", "mlp-l2", "mlp-cosine")
#: ``every-fold``: each fold picks its own learning rate from the grid on its validation set;
#: ``first-fold``: the first fold picks per layer and map, and the other folds train only that
#: rate (a budget option: the grid's cost is paid once instead of once per fold).
RATE_SEARCHES = ("every-fold", "first-fold")


@dataclass
class IdentifiabilityConfig:
    model: str
    dataset: str | None = None
    split: str | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    limit: int | None = None
    max_length: int = 128
    folds: int = 10
    fold_scheme: str = "kfold"
    learning_rates: tuple[float, ...] = LEARNING_RATES
    rate_search: str = "every-fold"
    max_epochs: int = 1000
    patience: int = 20
    batch_size: int = 256
    hidden_units: int = 1000
    hta_limit: int = 20
    hta_norm: str = "sum"
    seed: int = 0
    device: str = "auto"


def sentence_states(loaded: LoadedModel, config: IdentifiabilityConfig):
    """Per sentence, its hidden states at every layer on real tokens: list of (L + 1, n, D)."""
    data = load_examples(
        config.dataset,
        config.split,
        config.text_column,
        config.text_pair_column,
        None,
        config.limit,
    )
    batches, truncated = make_batches(data.examples, loaded.tokenizer, 32, config.max_length)
    if truncated:
        console.warn(f"{truncated} inputs truncated to {config.max_length} tokens")
    sentences = []
    for batch in batches:
        trace = trace_batch(loaded, batch.to(loaded.device), {"hidden_states"})
        stacked_BLND = torch.stack(trace.hidden_states, dim=1).cpu()
        sentences += [stacked_BLND[b, :, :n] for b, n in enumerate(batch.lengths)]
    return data, sentences


def _distance(predicted_ND: torch.Tensor, candidates_KD: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "cosine":
        return 1 - nn.functional.cosine_similarity(
            predicted_ND[:, None], candidates_KD[None], dim=-1
        )
    return torch.cdist(predicted_ND, candidates_KD)


def identification_rate(
    predicted: list[torch.Tensor], inputs: list[torch.Tensor], kind: str
) -> float:
    """Share of tokens whose nearest input embedding in their own sentence is their own."""
    hits = total = 0
    for predicted_ND, inputs_ND in zip(predicted, inputs, strict=True):
        nearest = _distance(predicted_ND, inputs_ND, kind).argmin(dim=1)
        hits += int((nearest == torch.arange(len(nearest))).sum())
        total += len(nearest)
    return hits / total


def _make_map(kind: str, width: int, hidden: int) -> nn.Module:
    model = (
        nn.Linear(width, width)
        if kind == "linear"
        else nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
    )
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)
    return model


def _loss(predicted: torch.Tensor, target: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "cosine":
        return (1 - nn.functional.cosine_similarity(predicted, target, dim=-1)).mean()
    return (predicted - target).pow(2).sum(dim=-1).mean()


def train_map(
    name: str, train: tuple, validation: tuple, rate: float, config: IdentifiabilityConfig
) -> tuple[nn.Module, float]:
    """Train one map with early stopping; return it at its best validation loss."""
    kind, loss_kind = name.split("-")
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    model = _make_map(kind, train[0].shape[1], config.hidden_units)
    optimizer = torch.optim.Adam(model.parameters(), lr=rate, betas=(0.9, 0.999))
    best, best_state, waited = math.inf, None, 0
    for _epoch in range(config.max_epochs):
        model.train()
        for index in torch.randperm(len(train[0]), generator=generator).split(config.batch_size):
            optimizer.zero_grad()
            _loss(model(train[0][index]), train[1][index], loss_kind).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            current = float(_loss(model(validation[0]), validation[1], loss_kind))
        if current < best - 1e-7:
            best, waited = current, 0
            best_state = {k: v.clone() for k, v in model.state_dict().items()}
        else:
            waited += 1
            if waited >= config.patience:
                break
    model.load_state_dict(best_state)
    return model, best


def _tokens(sentences: list[torch.Tensor], indices: list[int], layer: int) -> tuple:
    return (
        torch.cat([sentences[i][layer] for i in indices]),
        torch.cat([sentences[i][0] for i in indices]),
    )


def fold_splits(
    count: int, folds: int, scheme: str, seed: int
) -> list[tuple[list[int], list[int], list[int]]]:
    """Per fold, its (train, validation, test) sentence indices. ``kfold``: one seeded order cut
    into ``folds`` test folds of sizes differing by at most one, every sentence tested once;
    the rest of each fold split seeded per fold, ``VALIDATION_SHARE`` validating (so 70/15/15
    of all where a test fold is 15%). ``repeated``: per fold its own seeded 70/15/15 split."""
    if scheme not in FOLD_SCHEMES:
        raise UsageError(f"fold scheme must be one of {', '.join(FOLD_SCHEMES)}, got {scheme!r}")
    splits = []
    if scheme == "repeated":
        for fold in range(folds):
            order = list(range(count))
            random.Random(seed + fold).shuffle(order)
            cut1, cut2 = int(0.7 * count), int(0.85 * count)
            splits.append((order[:cut1], order[cut1:cut2], order[cut2:]))
        return splits
    order = list(range(count))
    random.Random(seed).shuffle(order)
    bounds = [count * fold // folds for fold in range(folds + 1)]
    for fold in range(folds):
        test = order[bounds[fold] : bounds[fold + 1]]
        rest = order[: bounds[fold]] + order[bounds[fold + 1] :]
        random.Random(seed + 1 + fold).shuffle(rest)
        cut = max(1, round(VALIDATION_SHARE * len(rest)))
        splits.append((rest[cut:], rest[:cut], test))
    return splits


def identifiability(loaded: LoadedModel, sentences: list, config: IdentifiabilityConfig) -> dict:
    """Per layer and fold: naive and learned-map identification rates on held-out sentences."""
    layers = sentences[0].shape[0]
    results: dict[str, list[list[float]]] = {
        name: [[] for _ in range(layers)] for name in ("naive-l2", "naive-cosine", *MAPS)
    }
    chosen_rates: dict[str, list] = {name: [[] for _ in range(layers)] for name in MAPS}
    grid = len(config.learning_rates)
    searched = config.folds if config.rate_search == "every-fold" else 1
    total = layers * len(MAPS) * (searched * grid + config.folds - searched)
    with console.progress() as bar:
        task = bar.add_task("training maps", total=total)
        splits = fold_splits(len(sentences), config.folds, config.fold_scheme, config.seed)
        for fold, (train, validation, test) in enumerate(splits):
            test_inputs = [sentences[i][0] for i in test]
            for layer in range(layers):
                states = [sentences[i][layer] for i in test]
                for kind in ("l2", "cosine"):
                    rate = identification_rate(states, test_inputs, kind)
                    results[f"naive-{kind}"][layer].append(rate)
                train_xy = _tokens(sentences, train, layer)
                validation_xy = _tokens(sentences, validation, layer)
                for name in MAPS:
                    candidates = []
                    rates = (
                        config.learning_rates
                        if fold < searched
                        else (chosen_rates[name][layer][0],)
                    )
                    for rate in rates:
                        candidates.append(
                            (*train_map(name, train_xy, validation_xy, rate, config), rate)
                        )
                        bar.advance(task)
                    model, _, rate = min(candidates, key=lambda c: c[1])
                    with torch.no_grad():
                        predicted = [model(s) for s in states]
                    distance = name.split("-")[1]
                    results[name][layer].append(
                        identification_rate(predicted, test_inputs, distance)
                    )
                    chosen_rates[name][layer].append(rate)
    return {"rates": results, "learning_rates_chosen": chosen_rates}


def hta_analysis(loaded: LoadedModel, sentences: list, config: IdentifiabilityConfig) -> dict:
    """Own-token contribution, own-is-top share and contribution by distance, per layer."""
    chosen = sentences[: config.hta_limit]
    layers = sentences[0].shape[0] - 1
    own = [[] for _ in range(layers)]
    top = [[] for _ in range(layers)]
    by_distance: list[dict[int, list[float]]] = [{} for _ in range(layers)]
    # A pair of n tokens costs about n passes over n tokens; the sentences come longest first
    # (``make_batches``' order), so a count of pairs would overstate the time left.
    work = [states.shape[1] ** 2 for states in chosen]
    with console.progress() as bar:
        task = bar.add_task(f"HTA ({config.hta_norm})", total=len(chosen), work=sum(work))
        for states, cost in zip(chosen, work, strict=True):
            x_ND = states[0].to(loaded.device)
            n = x_ND.shape[0]
            c_LJN = contributions(loaded, x_ND, config.hta_norm, targets=range(n)).cpu()
            distance = (torch.arange(n)[:, None] - torch.arange(n)[None]).abs()
            for layer in range(layers):
                matrix = c_LJN[layer]
                own[layer] += matrix.diagonal().tolist()
                top[layer] += (matrix.argmax(dim=1) == torch.arange(n)).float().tolist()
                for gap in range(n):
                    by_distance[layer].setdefault(gap, []).extend(matrix[distance == gap].tolist())
            bar.advance(task, work=cost)
    return {
        "norm": config.hta_norm,
        "sentences": len(chosen),
        "own_contribution": [sum(v) / len(v) for v in own],
        "own_is_top_share": [sum(v) / len(v) for v in top],
        "contribution_by_distance": [
            {str(gap): sum(v) / len(v) for gap, v in sorted(layer.items()) if gap <= 20}
            for layer in by_distance
        ],
    }


def summarize_rates(rates: dict[str, list[list[float]]]) -> dict[str, list[dict]]:
    """Per map and layer: the mean over folds, their standard deviation and Student's t 95%
    interval of the mean (NaN from one fold). K-fold estimates share training sentences, so
    the interval treats correlated folds as independent: read it as a spread, not a test."""
    out = {}
    for name, per_layer in rates.items():
        rows = []
        for values in per_layer:
            tensor = torch.tensor(values, dtype=torch.float64)
            mean = float(tensor.mean())
            std = float(tensor.std()) if len(values) > 1 else 0.0
            half = (
                float(stats.t.ppf(0.975, len(values) - 1)) * std / math.sqrt(len(values))
                if len(values) > 1
                else math.nan
            )
            rows.append(
                {
                    "mean": mean,
                    "std": std,
                    "ci95": [mean - half, mean + half],
                    "folds": len(values),
                }
            )
        out[name] = rows
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, rows in report["identifiability"].items():
        layers = list(range(len(rows)))
        means = [r["mean"] for r in rows]
        stds = [r["std"] for r in rows]
        left.errorbar(layers, means, yerr=stds, marker="o", capsize=3, label=name)
    left.set_xlabel("layer (0 = embeddings)")
    left.set_ylabel("identifiability rate (test tokens)")
    left.set_ylim(0, 1.02)
    left.legend(fontsize=8)
    hta = report["hta"]
    layers = list(range(1, len(hta["own_contribution"]) + 1))
    right.plot(layers, hta["own_contribution"], marker="o", label="mean own-token contribution")
    right.plot(layers, hta["own_is_top_share"], marker="s", label="share: own token is top")
    right.set_xlabel("layer")
    right.set_ylim(0, 1.02)
    right.set_title(f"HTA ({hta['norm']}, {hta['sentences']} sentences)")
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def run_identifiability(
    config: IdentifiabilityConfig,
    output_dir: Path,
    *,
    architectures: Mapping[str, ArchitectureSpec],
) -> dict:
    """Fit the token-identifiability maps and write the report; ``architectures`` are the
    model families known (``Registry.architecture_specs()``)."""
    if config.folds < 1 or config.max_epochs < 1 or config.patience < 1:
        raise UsageError("--folds, --max-epochs and --patience must be at least 1")
    if config.fold_scheme == "kfold" and config.folds < 2:
        raise UsageError("--fold-scheme kfold needs --folds of at least 2")
    if config.fold_scheme not in FOLD_SCHEMES:
        raise UsageError(f"--fold-scheme must be one of {', '.join(FOLD_SCHEMES)}")
    if config.rate_search not in RATE_SEARCHES:
        raise UsageError(f"--rate-search must be one of {', '.join(RATE_SEARCHES)}")
    loaded = load_model(config.model, config.device, architectures=architectures)
    data, sentences = sentence_states(loaded, config)
    if len(sentences) < 7:
        raise UsageError(f"identifiability needs at least 7 sentences, got {len(sentences)}")
    if config.fold_scheme == "kfold" and config.folds > len(sentences) // 2:
        raise UsageError(
            f"--folds {config.folds} leaves test folds of fewer than 2 of the "
            f"{len(sentences)} sentences"
        )
    learned = identifiability(loaded, sentences, config)
    report = {
        "config": asdict(config),
        "model": {"id": loaded.model_id, "weights_sha256": loaded.weights_sha256},
        "dataset": {
            "name": data.name,
            "split": data.split,
            "fingerprint": data.fingerprint,
            "sentences": len(sentences),
            "tokens": sum(s.shape[1] for s in sentences),
        },
        "candidates": "the input tokens of the same sentence",
        "identifiability": summarize_rates(learned["rates"]),
        "learning_rates_chosen": learned["learning_rates_chosen"],
        "hta": hta_analysis(loaded, sentences, config),
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    from attrib_bench.results import write_json

    write_json(report, output_dir / "identifiability.json")
    plot(report, output_dir / "identifiability.png")
    return report
