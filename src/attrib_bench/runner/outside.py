"""``attrib-bench evaluate``: score attributions another tool computed, with no explainer run.

A file's scores become one or more *file attributors*: each returns, for a traced batch, the
rows the file holds for its examples, so the runner, the evaluators, the statistics and the
result document treat them as any method (each batch still gets one plain forward pass, which
the removal evaluators read). Formats, detected from the file:

- ``attribute``: the JSONL ``attrib-bench attribute`` writes (``id, tokens, method, aggregated,
  local``), one method per ``method`` (``--method`` keeps one);
- ``generic``: JSONL ``{"id" or "text", "tokens", "scores"}``, scores one per token (one row) or
  a list of rows (layers), and an optional ``target`` class index;
- ``captum``: a ``torch.save`` file of a dict ``{id: tensor}`` or a list of tensors in dataset
  order, each (N,) or (N, D) over the example's N tokens (special tokens included; a leading
  batch dimension of 1 is dropped), D reduced by ``reduce`` (the gradient plugin's choices);
- ``eraser``: ERASER JSONL ``{"annotation_id", "rationales": [{"soft_rationale_predictions"}]}``,
  one score per word of ``text.split()``: every sub-token of a word gets the word's score (the
  ERASER / ferret convention), special tokens, padding and a pair's second text 0;
- ``inseq``: what Inseq's ``FeatureAttributionOutput.save`` writes (JSON, gzip-compressed or
  not) for a decoder-only model: per prompt (``info.input_texts``, matched to the data's text),
  the first generated token's column of ``target_attributions`` over the prompt tokens, (T,) or
  (T, D) reduced by ``reduce``; that token must be the example's next token.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attrib_bench.core import console
from attrib_bench.core.errors import UsageError, unknown_choice
from attrib_bench.core.interfaces import Attribution, Batch, Example
from attrib_bench.core.plugin_info import attributor_info, evaluator_info
from attrib_bench.core.registry import Registered, Registry, Spec
from attrib_bench.core.trace import Trace
from attrib_bench.runner.engine import prepare, run_single
from attrib_bench.runner.state import Prepared, RunConfig

FORMATS = ("attribute", "generic", "captum", "eraser", "inseq")
#: How Inseq's ``save`` starts a file (sorted keys): the output class's module.
INSEQ_HEAD = re.compile(rb'\s*\{\s*"__instance_type__"\s*:\s*\[\s*"inseq\.')
GZIP_MAGIC = b"\x1f\x8b"
REDUCTIONS = ("l2", "sum", "abs-sum")
#: What ``evaluate`` scores without ``--evaluators``: the faithfulness pair, which needs no
#: reference (the registry's default, spearman, would run a reference explainer).
DEFAULT_EVALUATORS = ("comprehensiveness", "sufficiency")


@dataclass
class Rows:
    """One example's scores as a file gives them, before they meet the tokenizer."""

    aggregated_LN: np.ndarray
    local_LN: np.ndarray | None = None
    tokens: list[str] | None = None
    #: ERASER: per-word scores, spread over each word's sub-tokens (``aggregated_LN`` unused).
    words: np.ndarray | None = None
    target: int | None = None
    #: Inseq: the token the scores explain, which must be the example's next token (its gold).
    next_token: int | None = None


@dataclass
class FileMethod:
    """One method's rows in a file, keyed by example id (or by text, ``by_text``)."""

    rows: dict[str, Rows] = field(default_factory=dict)
    by_text: bool = False
    #: The registry spec the rows came from (``attribute`` files), whose explained target the
    #: removal evaluators then score.
    spec: str | None = None
    #: Why the method failed when the file was written (``attribute`` files): not scored.
    error: str | None = None
    #: The run target and seed an ``attribute`` file was written with (None for a file written
    #: before records carried them), which ``evaluate`` adopts.
    written: tuple[str | None, int | None] = (None, None)


def _lines(path: Path) -> list[dict]:
    records = []
    with path.open() as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise UsageError(f"{path}: line {number} is not JSON") from None
            if not isinstance(record, dict):
                raise UsageError(f"{path}: line {number} is not a JSON object")
            records.append(record)
    if not records:
        raise UsageError(f"attributions file {str(path)!r} holds no records")
    return records


def detect_format(path: Path) -> str:
    """The file's format from its first bytes (torch.save: zip or pickle) or first record."""
    with path.open("rb") as handle:
        head = handle.read(2)
    if not head:
        raise UsageError(f"attributions file {str(path)!r} is empty")
    if head in (b"PK", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"):
        return "captum"
    if is_inseq_file(path):
        return "inseq"
    try:  # a decoding error is a ValueError too
        with path.open() as handle:
            line = next((line for line in handle if line.strip()), None)
        first = json.loads(line) if line is not None else None
    except ValueError:
        first = None
    if not isinstance(first, dict):
        raise UsageError(f"{path}: neither JSONL nor a torch.save file")
    if "method" in first and ("aggregated" in first or "error" in first):
        return "attribute"
    if "annotation_id" in first and "rationales" in first:
        return "eraser"
    if "scores" in first and ("id" in first or "text" in first):
        return "generic"
    raise UsageError(
        f"{path}: unknown attributions format (first record has keys {sorted(first)}); expected "
        "attrib-bench attribute JSONL, {id or text, tokens, scores} JSONL, ERASER JSONL "
        "(annotation_id, rationales), an Inseq JSON or a torch.save file"
    )


def is_inseq_file(path: Path) -> bool:
    """Whether the file starts as Inseq's ``save`` writes (its first 256 bytes, gzip-compressed
    or not); a gzip file that Inseq did not save is a UsageError."""
    with path.open("rb") as handle:
        gzipped = handle.read(2) == GZIP_MAGIC
    try:
        with gzip.open(path) if gzipped else path.open("rb") as handle:
            head = handle.read(256)
    except (OSError, EOFError):
        raise UsageError(f"{path}: not a readable gzip file") from None
    if gzipped and not INSEQ_HEAD.match(head):
        raise UsageError(f"{path}: a gzip file, but not one Inseq saved")
    return bool(INSEQ_HEAD.match(head))


def _matrix(values: Any, where: str, rows: bool = True) -> np.ndarray:
    """Scores as rows (L, N): a flat list is one row (the only shape ``rows=False`` takes)."""
    try:
        array = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{where}: scores are not numbers (or rows of unequal length)") from None
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[0] < 1 or (not rows and array.shape[0] != 1):
        shape = "a list of numbers" if not rows else "a list per token or a list of such rows"
        raise UsageError(f"{where}: scores must be {shape}")
    return array


def _add(method: FileMethod, key: Any, rows: Rows, where: str) -> None:
    """One example's rows; a second record for the same example is refused (which would win?)."""
    key = str(key)
    if key in method.rows:
        raise UsageError(f"{where}: example {key!r} appears twice")
    method.rows[key] = rows


def _read_attribute(path: Path, method: str | None) -> dict[str, FileMethod]:
    methods: dict[str, FileMethod] = {}
    failed: dict[str, str] = {}
    runs: set[tuple[Any, Any]] = set()
    for record in _lines(path):
        if "error" in record:
            failed[record["method"]] = record["error"]
            continue
        runs.add((record.get("target"), record.get("seed")))
        if len(runs) > 1:  # say, shards at two targets concatenated: one evaluation, one target
            shown = "; ".join(f"target {t}, seed {s}" for t, s in sorted(runs, key=str))
            raise UsageError(
                f"{path} holds records of different runs ({shown}): evaluate each alone"
            )
        spec = record["method"]
        where = f"{path}: example {record['id']!r} of {spec}"
        local = record.get("local")
        rows = Rows(
            _matrix(record["aggregated"], where),
            None if local is None else _matrix(local, where),
            tokens=record["tokens"],
        )
        _add(methods.setdefault(spec, FileMethod(spec=spec)), record["id"], rows, f"{path}: {spec}")
    for spec, error in failed.items():  # its rows of the batches before it failed dropped
        methods[spec] = FileMethod(spec=spec, error=error)
    target, seed = runs.pop() if runs else (None, None)
    for file_method in methods.values():
        file_method.written = (None if target is None else str(target)), seed
    if method is not None:
        wanted = str(Spec.parse(method))
        if wanted in failed:
            raise UsageError(f"{path}: {wanted} failed when the file was written: {failed[wanted]}")
        if wanted not in methods:
            raise unknown_choice(f"method in {path}", wanted, methods)
        return {wanted: methods[wanted]}
    if all(m.error is not None for m in methods.values()):
        raise UsageError(f"{path}: no method has attributions (all failed)")
    return methods


def _read_generic(path: Path) -> FileMethod:
    method = FileMethod()
    records = _lines(path)
    method.by_text = "id" not in records[0]
    for number, record in enumerate(records, 1):
        key = "text" if method.by_text else "id"
        if key not in record or "tokens" not in record or "scores" not in record:
            raise UsageError(f"{path}: line {number} lacks {key!r}, 'tokens' or 'scores'")
        target = record.get("target")
        valid = isinstance(target, int) and not isinstance(target, bool) and target >= 0
        if target is not None and not valid:
            raise UsageError(
                f"{path}: line {number}: target must be a class index >= 0, got {target!r}"
            )
        where = f"{path}: example {record[key]!r}"
        rows = Rows(_matrix(record["scores"], where), tokens=list(record["tokens"]), target=target)
        _add(method, record[key], rows, str(path))
    targets = {rows.target is None for rows in method.rows.values()}
    if len(targets) > 1:
        raise UsageError(f"{path}: give a target for every example or for none")
    return method


def reduce_hidden(values: torch.Tensor, reduce: str) -> torch.Tensor:
    """(N, D) -> (N,) as the gradient plugin reduces the hidden dimension."""
    if reduce == "l2":
        return values.norm(dim=-1)
    if reduce == "sum":
        return values.sum(dim=-1)
    return values.abs().sum(dim=-1)


def _read_captum(path: Path, reduce: str, examples: list[Example]) -> FileMethod:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UsageError(f"{path}: not a readable torch.save file ({first})") from None
    if isinstance(loaded, (list, tuple)):
        if len(loaded) != len(examples):
            raise UsageError(
                f"{path}: a list of {len(loaded)} tensors, but the data has {len(examples)} "
                "examples (a list is read in dataset order; save a dict {id: tensor} instead)"
            )
        loaded = {e.id: values for e, values in zip(examples, loaded, strict=True)}
    if not isinstance(loaded, dict):
        raise UsageError(
            f"{path}: holds a {type(loaded).__name__}; expected a dict {{id: tensor}} or a list "
            "of tensors in dataset order"
        )
    method = FileMethod()
    for key, values in loaded.items():
        if not isinstance(values, torch.Tensor):
            raise UsageError(f"{path}: example {key!r} is a {type(values).__name__}, not a tensor")
        values = values.detach().float()
        if values.dim() >= 2 and values.shape[0] == 1:
            values = values[0]
        if values.dim() == 2:
            values = reduce_hidden(values, reduce)
        if values.dim() != 1:
            raise UsageError(
                f"{path}: example {key!r} has shape {tuple(values.shape)}; expected (N,) or (N, D)"
            )
        method.rows[str(key)] = Rows(values.numpy()[None, :])  # dict keys: never twice
    return method


def _read_eraser(path: Path) -> FileMethod:
    method = FileMethod()
    for record in _lines(path):
        rationales = record["rationales"]
        if not isinstance(rationales, list) or not all(isinstance(r, dict) for r in rationales):
            raise UsageError(
                f"{path}: annotation {record['annotation_id']!r}: rationales must be a list of "
                "objects"
            )
        soft = [r for r in rationales if r.get("soft_rationale_predictions") is not None]
        if not soft:
            raise UsageError(
                f"{path}: annotation {record['annotation_id']!r} has no soft_rationale_predictions"
            )
        where = f"{path}: annotation {record['annotation_id']!r}"
        (words,) = _matrix(soft[0]["soft_rationale_predictions"], where, rows=False)
        _add(method, record["annotation_id"], Rows(np.zeros((1, 0)), words=words), str(path))
    return method


def inseq_tensor(encoded: str, where: str) -> torch.Tensor:
    """A tensor Inseq stored as base64 of a safetensors file holding it as ``attribution``."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(base64.b64decode(encoded))["attribution"].float()
    except (ValueError, KeyError, SafetensorError):
        raise UsageError(f"{where}: attributions are not a tensor Inseq saved") from None


def inseq_scores(encoded: str, where: str, reduce: str) -> torch.Tensor:
    """One of Inseq's attribution tensors, (rows, steps): scores per hidden unit (rows, steps,
    D) reduced by ``reduce``; scores per layer and head refused in one line."""
    values = inseq_tensor(encoded, where)
    if values.dim() == 3:
        values = reduce_hidden(values, reduce)
    if values.dim() != 2:
        raise UsageError(
            f"{where}: scores of shape {tuple(values.shape)} (layers and heads?): save them "
            "aggregated, out.aggregate().save(...), to score them"
        )
    return values


def load_inseq(path: Path) -> dict[str, Any]:
    """The ``attributes`` of an Inseq-saved ``FeatureAttributionOutput`` (``info`` and
    ``sequence_attributions``), its tensors still encoded (``inseq_tensor`` decodes one)."""
    with path.open("rb") as handle:
        gzipped = handle.read(2) == GZIP_MAGIC
    try:
        with gzip.open(path, "rt") if gzipped else path.open() as handle:
            return json.load(handle)["attributes"]
    except (OSError, EOFError, ValueError, KeyError, TypeError):
        raise UsageError(f"{path}: not a readable Inseq JSON file") from None


def _read_inseq(path: Path, reduce: str) -> FileMethod:
    """Per prompt, the first generated token's scores over the prompt tokens."""
    attributes = load_inseq(path)
    texts = attributes["info"]["input_texts"]
    sequences = attributes["sequence_attributions"]
    if len(texts) != len(sequences):
        raise UsageError(f"{path}: {len(texts)} input texts but {len(sequences)} attributions")
    method = FileMethod(by_text=True)
    for text, sequence in zip(texts, sequences, strict=True):
        where = f"{path}: prompt {text!r}"
        sequence = sequence["attributes"]
        if sequence.get("source_attributions") is not None:
            raise UsageError(
                f"{where}: attributions of an encoder-decoder model, which evaluate does not read "
                "(next-token data): score them with attrib-bench context --dataset FILE"
            )
        if sequence.get("target_attributions") is None:
            raise UsageError(f"{where}: no target_attributions")
        start = sequence["attr_pos_start"]
        tokens = [token["attributes"] for token in sequence["target"]]
        values = inseq_scores(sequence["target_attributions"], f"{where}: target", reduce)
        if values.shape[0] != len(tokens) or start >= len(tokens):
            raise UsageError(
                f"{where}: target_attributions of shape {tuple(values.shape)} do not fit its "
                f"{len(tokens)} tokens"
            )
        values = values[:start, 0]  # the first generated token's column, over the prompt
        rows = Rows(
            values.numpy()[None, :],
            tokens=[token["token"] for token in tokens[:start]],
            next_token=tokens[start]["id"],
        )
        _add(method, text, rows, str(path))
    return method


def read_file(
    path: Path, fmt: str, examples: list[Example], method: str | None, reduce: str
) -> dict[str, FileMethod]:
    """The file's methods by spec (one, keyed None, for formats holding a single method)."""
    if method is not None and fmt != "attribute":
        raise UsageError(f"--method picks a method of an attribute JSONL; {path} is {fmt}")
    try:
        if fmt == "attribute":
            return _read_attribute(path, method)
        if fmt == "generic":
            return {"": _read_generic(path)}
        if fmt == "captum":
            return {"": _read_captum(path, reduce, examples)}
        if fmt == "inseq":
            return {"": _read_inseq(path, reduce)}
        return {"": _read_eraser(path)}
    except (KeyError, TypeError) as error:  # a record without a field its format needs
        message = f"{path}: a {fmt} record is malformed ({error!r} missing or wrong)"
        raise UsageError(message) from None


def _tokens_problem(expected: list[str], given: list[str]) -> str | None:
    for position, (want, got) in enumerate(zip(expected, given, strict=False)):
        if want != got:
            return f"token {position} is {got!r} in the file, {want!r} under the tokenizer"
    if len(expected) != len(given):
        return f"{len(given)} tokens in the file, {len(expected)} under the tokenizer"
    return None


class FileAttributor:
    """An attributor whose scores are read from a file: no computation, no trace fields."""

    requires: frozenset[str] = frozenset()
    #: Runs only in the ``evaluate`` that reads it: not a method a default run left out.
    in_default_run = False

    def __init__(self, name: str, method: FileMethod, source: Path, own: Any = None) -> None:
        self.name = name
        self.source = source
        self.description = f"scores read from {source}"
        self.method = method
        #: The registry method behind an ``attribute`` file's rows (its explained target).
        self.own = own
        self.rows: dict[str, Rows] = {}
        #: Examples whose rows were served: a second request is an evaluator re-running the
        #: method (``sanity``'s randomised model, ``classes=all``), which a file cannot do.
        self.served: set[str] = set()

    def check(self, prepared: Prepared) -> None:
        """Every example's rows, found and checked against its tokens, its scores finite and
        its target a class of the model, before any pass: one line naming the first missing or
        mismatching example."""
        classes = prepared.loaded.class_count
        tokenizer = prepared.loaded.tokenizer
        generated = any(rows.next_token is not None for rows in self.method.rows.values())
        if generated and not prepared.loaded.is_language_model:
            raise UsageError(
                f"{self.source} explains generated tokens: score it on a causal language model "
                "and next-token data"
            )
        shape: tuple[int, int | None] | None = None  # (aggregated rows, local rows) of the first
        for batch in prepared.batches:
            for row, example in enumerate(batch.examples):
                key = example.text if self.method.by_text else example.id
                found = self.method.rows.get(key)
                if found is None:
                    what = "text" if self.method.by_text else "id"
                    raise UsageError(f"{self._where(example)}: no attributions (by {what})")
                if found.next_token is not None and found.next_token != example.label:
                    explained, gold = tokenizer.convert_ids_to_tokens(
                        [found.next_token, example.label]
                    )
                    raise UsageError(
                        f"{self._where(example)} explains the token {explained!r} after it, "
                        f"but the data's next token is {gold!r}"
                    )
                if found.target is not None and found.target >= classes:
                    raise UsageError(
                        f"{self._where(example)} has target {found.target}, but the model has "
                        f"{classes} classes"
                    )
                fitted = self.rows[example.id] = self._fitted(found, batch, row, example)
                local = None if fitted.local_LN is None else len(fitted.local_LN)
                shape = shape or (len(fitted.aggregated_LN), local)
                if (len(fitted.aggregated_LN), local) != shape:
                    raise UsageError(
                        f"{self._where(example)} holds {len(fitted.aggregated_LN)} "
                        f"aggregated and {local or 'no'} local rows, the first example "
                        f"{shape[0]} and {shape[1] or 'no'}: every example needs the same layers"
                    )

    def _where(self, example: Example) -> str:
        """An example in the file, for messages: the path as given, as the reader's messages say
        (the method's name is the file's stem, which hid the folder), and the method in it."""
        of = f" of {self.method.spec}" if self.method.spec else ""
        return f"{self.source}: example {example.id!r}{of}"

    def _fitted(self, rows: Rows, batch: Batch, row: int, example: Example) -> Rows:
        tokens = batch.tokens[row]
        where = self._where(example)
        for matrix in (rows.aggregated_LN, rows.local_LN, rows.words):
            if matrix is not None and not np.isfinite(matrix).all():
                raise UsageError(f"{where}: a score is not a finite number (NaN, inf or null)")
        if rows.words is not None:
            words = example.text.split()
            if len(rows.words) != len(words):
                raise UsageError(
                    f"{where}: {len(rows.words)} word scores, but the text has {len(words)} words"
                )
            word_ids = batch.word_ids_BN[row, : len(tokens)].numpy()
            spread = np.where(word_ids >= 0, rows.words[np.clip(word_ids, 0, None)], 0.0)
            return Rows(spread[None, :].astype(np.float32))
        if rows.tokens is not None:
            problem = _tokens_problem(tokens, rows.tokens)
            if problem is not None:
                raise UsageError(f"{where}: {problem}")
        for matrix in (rows.aggregated_LN, rows.local_LN):
            if matrix is not None and matrix.shape[1] != len(tokens):
                raise UsageError(
                    f"{where}: {matrix.shape[1]} scores per row, but the tokenizer gives "
                    f"{len(tokens)} tokens"
                )
        return rows

    def attribute(self, trace: Trace) -> Attribution:
        batch = trace.batch
        ids = {e.id for e in batch.examples}
        if ids & self.served:
            raise UsageError(
                f"{self.source}: an evaluator re-runs the method (on a randomised model, or for "
                "each class), which scores read from a file cannot do: leave that evaluator "
                "out, or score the method with attrib-bench run"
            )
        self.served |= ids
        B, N = batch.input_ids_BN.shape
        found = [self.rows[e.id] for e in batch.examples]
        kinds = {}
        for kind in ("aggregated_LN", "local_LN"):  # shapes alike over examples: ``check``
            matrices = [getattr(rows, kind) for rows in found]
            if matrices[0] is None:
                continue
            out_BLN = torch.zeros(B, len(matrices[0]), N)
            for b, matrix in enumerate(matrices):
                out_BLN[b, :, : matrix.shape[1]] = torch.from_numpy(matrix)
            kinds[kind] = out_BLN.to(batch.input_ids_BN.device)
        return Attribution(kinds["aggregated_LN"], kinds.get("local_LN"))

    def explained_target(self, trace: Trace) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The file's own target per example where it gives one, else its method's, else the
        run's (what the removal evaluators score: core.interfaces.scored_classes)."""
        if self.own is not None and attributor_info(self.own).explains_own_target:
            return self.own.explained_target(trace)
        targets = [self.rows[e.id].target for e in trace.batch.examples]
        if any(t is None for t in targets):
            return trace.target_classes_B, trace.target_foils_B
        return torch.tensor(targets, device=trace.batch.input_ids_BN.device), None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _method_names(path: Path, methods: dict[str, FileMethod], name: str | None) -> list[str]:
    """Names for the file's methods: ``--name`` (or the file stem) for one, ``NAME/method``
    (the spec's name) for several; never a registry spec, which would hide a built-in."""
    base = name or Path(path.name.removesuffix(".gz")).stem
    if len(methods) == 1:
        return [base]
    names = [f"{base}/{Spec.parse(spec).name}" for spec in methods]
    if len(set(names)) < len(names):
        raise UsageError(
            f"{path} holds several settings of one method ({', '.join(methods)}): pick one "
            "with --method SPEC"
        )
    return names


def _own_method(registry: Registry, spec: str | None) -> Any:
    """The installed method an ``attribute`` file names, if any (its explained target)."""
    if spec is None or Spec.parse(spec).name not in registry.attributors:
        return None
    return registry.attributor(spec)


def _register(registry: Registry, attributors: list[FileAttributor], path: Path) -> None:
    for attributor in attributors:
        if attributor.name in registry.attributors:
            raise UsageError(
                f"{attributor.name!r} is a registered attributor: name the file's method "
                "otherwise with --name"
            )
        info = attributor_info(attributor)
        registry.attributors[attributor.name] = Registered(attributor, f"file {path}", info)


def evaluate(
    attributions: Path,
    config: RunConfig,
    *,
    method: str | None = None,
    name: str | None = None,
    reduce: str = "l2",
    quiet: bool = False,
    keep_seed: bool = False,
) -> dict[str, Any]:
    """Score a file's attributions on ``config``'s model and data; the result document.

    An ``attribute`` file's target and seed are adopted where ``config.target`` is None and
    ``keep_seed`` is False (no ``--seed`` given), and refused where they differ.

    ``config.attributors`` is ignored; ``config.evaluators`` None scores DEFAULT_EVALUATORS.
    The reference runs only when a selected evaluator reads it (it may name a file method).
    No cache: the file is the only source of the scores.
    """
    path = Path(attributions)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise UsageError(f"attributions file {str(path)!r} {what}")
    if reduce not in REDUCTIONS:
        raise unknown_choice("--reduce", reduce, REDUCTIONS)
    fmt = detect_format(path)
    # An attribute file needs no data to read: read first, for the run it records.
    methods = read_file(path, fmt, [], method, reduce) if fmt == "attribute" else None
    written, seed = next(iter(methods.values())).written if methods else (None, None)
    if written is not None and config.target is None:
        config = dataclasses.replace(config, target=written)
    if seed is not None and not keep_seed:
        config = dataclasses.replace(config, seed=seed)
    elif seed is not None and seed != config.seed:
        raise UsageError(
            f"{path} was written with --seed {seed}, but --seed gives {config.seed}: leave "
            "--seed out to score with the file's"
        )
    reference = config.reference
    evaluators = list(config.evaluators or DEFAULT_EVALUATORS)
    base = dataclasses.replace(
        config, attributors=None, evaluators=evaluators, floor=False, reference="saliency"
    )
    prepared = prepare(base, quiet)
    if written is not None and str(prepared.target) != written:
        raise UsageError(
            f"{path} explains target {written}, but --target gives {prepared.target}: leave "
            "--target out to score the file's"
        )
    registry = prepared.registry
    if methods is None:
        methods = read_file(path, fmt, prepared.data.examples, method, reduce)
    failed = {spec: m.error for spec, m in methods.items() if m.error is not None}
    for spec, error in failed.items():
        console.warn(f"{spec} failed when the file was written and is not scored: {error}")
    methods = {spec: m for spec, m in methods.items() if m.error is None}
    names = _method_names(path, methods, name)
    attributors = [
        FileAttributor(n, m, path, own=_own_method(registry, m.spec))
        for n, m in zip(names, methods.values(), strict=True)
    ]
    _register(registry, attributors, path)
    for attributor in attributors:
        attributor.check(prepared)
    if Spec.parse(reference).name not in registry.attributors:
        raise unknown_choice("reference attributor", reference, registry.attributors)
    needs = any(evaluator_info(registry.evaluator(s)).needs_reference for s in evaluators)
    run_config = dataclasses.replace(base, attributors=names, reference=reference)
    # It reads scores and runs the evaluators: "attributing" would misname the work.
    document = run_single(
        run_config,
        quiet,
        cache=False,
        prepared=prepared,
        with_reference=needs,
        description="scoring",
    ).document()
    document["provenance"]["attributions"] = {
        "file": str(path),
        "format": fmt,
        "sha256": sha256(path),
        "methods": dict(zip(names, [m.spec for m in methods.values()], strict=True)),
        **({"reduce": reduce} if fmt in ("captum", "inseq") else {}),
        **({"failed": failed} if failed else {}),
    }
    return document
