"""Per-example results on disk, so reruns compute only what changed and killed runs resume.

One entry per (method, example) holds the example's tokens, the method's rows over them, the
seconds the method took for it, and its per-example scores per evaluator. Keys:

- **method key**: sha256 of the model (weights hash, config), seed, attribution target, device
  type, the torch, transformers and captum versions, a digest of attrib-bench's numeric core,
  and the method itself: name, parameters after defaults are applied (``rollout`` and
  ``rollout:residual=0.5`` share entries), its ``version`` attribute (``"0"`` if absent), the
  plugin's distribution and version (or file), and a digest of its package's source files.
- **example key**: sha256 of the example (id, text, pair, label, rationale) and of its model
  input (token ids and type ids after tokenisation and truncation). It identifies the example
  more narrowly than the dataset fingerprint: a changed ``--limit`` still reuses entries, while
  any change to the text, tokenizer or ``--max-length`` misses.
- **evaluator key**, inside an entry: the evaluator's name, parameters and code, plus the
  reference's method key when it needs one.

Entries are written atomically (temporary file, then ``os.replace``) with a sha256 of their
payload inside; an entry that fails to parse or to verify is reported, deleted and recomputed.
Layout: ``$ATTRIB_BENCH_CACHE/results/<method key>/<example key>.json``, plus ``key.json`` with
the readable method identity.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from attrib_bench.core import console
from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.interfaces import KINDS, Attribution, Batch
from attrib_bench.core.plugin_info import (
    PluginInfo,
    attributor_info,
    evaluator_info,
)
from attrib_bench.core.registry import Spec

if TYPE_CHECKING:
    from attrib_bench.runner.state import MethodState, Prepared

#: Bump when the entry layout or the meaning of a key changes.
FORMAT = 1
RESULTS_DIR = "results"
#: Set to 1 to run without reading or writing the cache (as ``--no-cache``).
NO_CACHE_ENV = "ATTRIB_BENCH_NO_CACHE"
#: Files and folders (ending in "/") of attrib-bench, relative to the package, that never
#: change a cached number (rendering, the CLI, the cache and config plumbing, analyses that
#: are not runs): editing them keeps the cache valid. tests/test_cache.py checks they exist.
PRESENTATION_MODULES = frozenset(
    {
        "__main__.py",
        "api.py",
        "cli.py",
        "core/console.py",
        "runner/cache.py",
        "runner/config.py",
        "analyses/",
        "reports/",
        "testing/",
    }
)
KEY_PACKAGES = ("torch", "transformers", "captum")
ENTRY_KEYS = frozenset({"id", "tokens", "dtype", "rows", "seconds", "peak_memory_mb", "scores"})


def results_root() -> Path:
    return cache_root() / RESULTS_DIR


def enabled(requested: bool = True) -> bool:
    """The cache is used unless ``--no-cache`` or ``ATTRIB_BENCH_NO_CACHE=1`` says otherwise."""
    return requested and os.environ.get(NO_CACHE_ENV, "").strip() in ("", "0")


def digest(value: Any) -> str:
    """A stable 128-bit hex digest of JSON-serialisable data (key order ignored)."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


#: Digests by the files' (path, mtime, size): a file edited in a long-lived process is rehashed.
_SOURCE_DIGESTS: dict[tuple, str] = {}


def _files_digest(files: Sequence[Path], root: Path) -> str:
    stamp = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(files))
    if stamp not in _SOURCE_DIGESTS:
        hasher = hashlib.sha256()
        for path in sorted(files):
            hasher.update(str(path.relative_to(root)).encode())
            hasher.update(path.read_bytes())
        _SOURCE_DIGESTS[stamp] = hasher.hexdigest()[:32]
    return _SOURCE_DIGESTS[stamp]


def _excluded(relative: str, exclude: frozenset[str]) -> bool:
    """Whether a file (its path relative to the package root) is one of ``exclude``: paths
    relative to that root, a trailing "/" naming a folder."""
    return any(relative == e or (e.endswith("/") and relative.startswith(e)) for e in exclude)


def source_digest(module_name: str, exclude: frozenset[str] = frozenset()) -> str:
    """Digest of a module's source: its whole top-level package, or the file of a lone module.

    Helpers a method imports from its own package count, so editing an installed plugin (an
    editable install keeps its version number) misses the cache instead of serving stale numbers.
    Code without a readable file gets a fresh random digest: never a stale hit, only a recompute.
    """
    module = sys.modules.get(module_name)
    if module is None:
        return uuid.uuid4().hex
    top = (module.__package__ or "").partition(".")[0]
    package = sys.modules.get(top) if top else None
    if package is not None and getattr(package, "__path__", None):
        roots = [Path(p) for p in package.__path__]
        files = [
            path
            for root in roots
            for path in root.rglob("*.py")
            if "__pycache__" not in path.parts
            and not _excluded(path.relative_to(root).as_posix(), exclude)
        ]
        return _files_digest(files, roots[0].parent) if files else uuid.uuid4().hex
    if getattr(module, "__file__", None) and Path(module.__file__).is_file():
        path = Path(module.__file__)
        return _files_digest([path], path.parent)
    return uuid.uuid4().hex


def package_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def code_identity(
    obj: Any, spec: str, source: str, info: PluginInfo | None = None
) -> dict[str, Any]:
    """What decides a plugin object's output besides its inputs: see the module docstring.
    ``info``: the object's record (an evaluator's; by default read as an attributor's)."""
    parsed = Spec.parse(spec)
    info = attributor_info(obj) if info is None else info
    cls = type(obj)
    return {
        "name": parsed.name,
        "params": dict(info.settings) if info.settings is not None else dict(parsed.params),
        "version": info.version,
        "plugin": source,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "source": source_digest(cls.__module__),
    }


def run_identity(prepared: Prepared, seed: int) -> dict[str, Any]:
    """The part of every method key shared by the run: model, seed, device, libraries, core."""
    loaded = prepared.loaded
    config = {k: v for k, v in loaded.model.config.to_dict().items() if not k.startswith("_")}
    config.pop("transformers_version", None)
    return {
        "format": FORMAT,
        "weights_sha256": loaded.weights_sha256,
        "model_config": digest(config),
        "seed": seed,
        "target": str(prepared.target),
        "device": loaded.device.type,
        "packages": {name: package_version(name) for name in KEY_PACKAGES},
        "core": source_digest("attrib_bench.runner.engine", exclude=PRESENTATION_MODULES),
    }


def example_key(batch: Batch, row: int) -> str:
    """Key of one example of a batch: its fields and its model input over the real tokens."""
    example = batch.examples[row]
    length = int(batch.attention_mask_BN[row].sum())
    types = batch.token_type_ids_BN
    fields = [
        example.id,
        example.text,
        example.text_pair,
        example.label,
        list(example.rationale) if example.rationale is not None else None,
        batch.input_ids_BN[row, :length].tolist(),
        types[row, :length].tolist() if types is not None else None,
    ]
    # The foil joins the key only when set, so that examples without one keep their old keys.
    return digest(fields if example.foil is None else [*fields, {"foil": example.foil}])


def _encode(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, separators=(",", ":"))
    checksum = hashlib.sha256(text.encode()).hexdigest()
    return json.dumps({"format": FORMAT, "sha256": checksum, "payload": text})


def _decode(text: str) -> dict[str, Any]:
    """The payload of an entry; ValueError when it is not one or its checksum fails."""
    try:
        outer = json.loads(text)
        inner = outer["payload"]
        if outer.get("format") != FORMAT:
            raise ValueError(f"format {outer.get('format')!r}, expected {FORMAT}")
        if hashlib.sha256(inner.encode()).hexdigest() != outer["sha256"]:
            raise ValueError("checksum mismatch")
        payload = json.loads(inner)
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as error:
        raise ValueError(f"unreadable ({type(error).__name__})") from None
    if not isinstance(payload, dict) or not set(payload) >= ENTRY_KEYS:
        raise ValueError("not a cache entry")
    return payload


def atomic_write(path: Path, text: str) -> None:
    """Write via a unique temporary file and ``os.replace``: readers see all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def read_entry(path: Path, repair: bool = True) -> dict[str, Any] | None:
    """An entry's payload; None when absent or corrupt. With ``repair`` (a run's own cache) a
    corrupt entry is reported and deleted; without (a path read from a result file, which may
    point anywhere) nothing is deleted."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        text = f"\0{error}"
    try:
        return _decode(text)
    except ValueError as error:
        if repair:
            console.warn(f"corrupt cache entry {path} ({error}): deleted, it will be recomputed")
            path.unlink(missing_ok=True)
        return None


def _nan_list(values: Any) -> list:
    """Scores as JSON: NaN (an undefined example) becomes null."""
    return [None if v is None or np.isnan(v) else float(v) for v in np.asarray(values, float)]


@dataclass
class ResultCache:
    """The cache as one run sees it: keys for its methods and evaluators, hits counted."""

    prepared: Prepared
    methods: list[MethodState]
    evaluators: dict[str, Any]
    reference: str
    seed: int
    method_keys: dict[str, str] = field(default_factory=dict)
    evaluator_keys: dict[str, str] = field(default_factory=dict)
    example_keys: dict[str, str] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    _entries: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    _seconds_seen: dict[str, float] = field(default_factory=dict)
    _missing: dict[str, frozenset[str]] = field(default_factory=dict)
    #: Why writing stopped (the first failed write), or None while the cache is writable.
    write_error: str | None = None

    def __post_init__(self) -> None:
        registry = self.prepared.registry
        shared = run_identity(self.prepared, self.seed)
        self._identities: dict[str, dict[str, Any]] = {}
        for method in self.methods:
            source = registry.attributors[Spec.parse(method.spec).name].source
            identity = {**shared, "method": code_identity(method.attributor, method.spec, source)}
            self._identities[method.spec] = identity
            self.method_keys[method.spec] = digest(identity)
            self.hits[method.spec] = 0
        self._all = frozenset(self.method_keys)
        for name, evaluator in self.evaluators.items():
            source = registry.evaluators[Spec.parse(name).name].source
            info = evaluator_info(evaluator)
            self.evaluator_keys[name] = digest(
                {
                    "evaluator": code_identity(evaluator, name, source, info),
                    "reference": (
                        self.method_keys.get(self.reference) if info.needs_reference else None
                    ),
                }
            )

    def _path(self, spec: str, key: str) -> Path:
        return results_root() / self.method_keys[spec] / f"{key}.json"

    def _complete(self, spec: str, key: str) -> dict[str, Any] | None:
        """The example's entry when it holds the rows and every evaluator's scores, else None."""
        entry = self._load(spec, key)
        if entry is None or not all(k in entry["scores"] for k in self.evaluator_keys.values()):
            return None
        return entry

    def _fill(self, method: MethodState, example_id: str, entry: dict[str, Any]) -> None:
        """Take one example's scores, seconds and memory for ``method`` from its entry."""
        for name, key in self.evaluator_keys.items():
            for kind, values in entry["scores"][key].items():
                method.column(name, kind)[example_id] = np.array(
                    [np.nan if v is None else v for v in values], dtype=float
                )
        if method.rows is not None:
            method.rows[example_id] = {
                kind: np.asarray(values, dtype=float)
                for kind, values in entry["rows"].items()
                if values is not None
            }
        method.seconds += entry["seconds"]
        method.peak_memory_mb = max(method.peak_memory_mb, entry["peak_memory_mb"])
        method.examples += 1
        self._seconds_seen[method.spec] = method.seconds
        self.hits[method.spec] += 1

    def _index(self, batch: Batch) -> list[str]:
        keys = [example_key(batch, row) for row in range(len(batch.examples))]
        for example, key in zip(batch.examples, keys, strict=True):
            self.example_keys[example.id] = key
        return keys

    def restore_complete(self, batches: Sequence[Batch]) -> dict[str, frozenset[str]]:
        """Fill in every (method, example) complete on disk; return, per example, the methods
        still to compute for it (empty: the example needs no forward pass at all).

        Called once before batching the work, so reuse is per (method, example) whatever the
        batching: the caller batches the examples by what they still miss.
        """
        missing: dict[str, frozenset[str]] = {}
        for batch in batches:
            for example, key in zip(batch.examples, self._index(batch), strict=True):
                todo = set()
                for method in self.methods:
                    entry = self._complete(method.spec, key)
                    if entry is None:
                        todo.add(method.spec)
                    else:
                        self._fill(method, example.id, entry)
                missing[example.id] = frozenset(todo)
            self._entries = {}
        self._missing |= missing
        return missing

    def restore(self, batch: Batch) -> set[str]:
        """Load the batch's entries (a reference's rows, older scores to keep); return the
        specs not to run on it: those :meth:`restore_complete` filled in for all its examples.

        Called before the batch is traced.
        """
        self._entries = {}
        keys = self._index(batch)
        todo = set().union(*(self._missing.get(e.id, self._all) for e in batch.examples))
        for method in self.methods:
            for key in keys:
                self._load(method.spec, key)
        return {m.spec for m in self.methods if m.spec not in todo}

    def _load(self, spec: str, key: str) -> dict[str, Any] | None:
        entry = read_entry(self._path(spec, key))
        if entry is not None:
            self._entries[(spec, key)] = entry
        return entry

    def attribution(self, spec: str, batch: Batch) -> Attribution | None:
        """A method's attribution of the batch rebuilt from its cached rows (None if missing)."""
        keys = [self.example_keys[e.id] for e in batch.examples]
        entries = [self._entries.get((spec, key)) for key in keys]
        if any(entry is None for entry in entries):
            return None
        width = batch.input_ids_BN.shape[1]
        device = batch.input_ids_BN.device
        rebuilt: dict[str, torch.Tensor | None] = {}
        for kind in KINDS:
            if entries[0]["rows"].get(kind) is None:
                rebuilt[kind] = None
                continue
            dtype = getattr(torch, entries[0]["dtype"])
            layers = len(entries[0]["rows"][kind])
            rows_BLN = torch.zeros((len(entries), layers, width), dtype=dtype, device=device)
            for row, entry in enumerate(entries):
                values = torch.tensor(entry["rows"][kind], dtype=dtype)
                rows_BLN[row, :, : values.shape[1]] = values
            rebuilt[kind] = rows_BLN
        return Attribution(aggregated_BLN=rebuilt["aggregated"], local_BLN=rebuilt["local"])

    def save(self, batch: Batch, results: Mapping[str, Attribution]) -> None:
        """Write an entry per example for every method computed on this batch.

        Scores of evaluators already cached in an older entry for this example are kept. The
        cache is optional: a write that fails (a full disk, no permission) warns once and turns
        writing off for the rest of the run, which goes on and writes its result.
        """
        if self.write_error is not None:
            return
        try:
            self._save(batch, results)
        except OSError as error:
            self.write_error = f"{type(error).__name__}: {error}"
            console.warn(
                f"cache: cannot write to {results_root()} ({self.write_error}); caching is off "
                "for the rest of this run, its results are unaffected (free space, set "
                "ATTRIB_BENCH_CACHE to another folder, or run with --no-cache)"
            )

    def _save(self, batch: Batch, results: Mapping[str, Attribution]) -> None:
        states = {m.spec: m for m in self.methods}
        for spec, attribution in results.items():
            method = states[spec]
            seconds = method.seconds - self._seconds_seen.get(spec, 0.0)
            self._seconds_seen[spec] = method.seconds
            self._write_key(spec)
            for row, (example, length) in enumerate(
                zip(batch.examples, batch.lengths, strict=True)
            ):
                key = self.example_keys[example.id]
                previous = self._entries.get((spec, key))
                scores = dict(previous["scores"]) if previous else {}
                for name, kinds in method.scores.items():
                    if name in self.evaluator_keys and all(
                        example.id in by_id for by_id in kinds.values()
                    ):
                        scores[self.evaluator_keys[name]] = {
                            kind: _nan_list(by_id[example.id]) for kind, by_id in kinds.items()
                        }
                payload = {
                    "id": example.id,
                    "tokens": batch.tokens[row],
                    "dtype": str(attribution.aggregated_BLN.dtype).removeprefix("torch."),
                    "rows": {kind: attribution.example_rows(kind, row, length) for kind in KINDS},
                    "seconds": seconds / len(batch.examples),
                    "peak_memory_mb": method.batch_memory_mb,
                    "scores": scores,
                }
                atomic_write(self._path(spec, key), _encode(payload))

    def _write_key(self, spec: str) -> None:
        path = results_root() / self.method_keys[spec] / "key.json"
        if not path.is_file():
            atomic_write(path, json.dumps(self._identities[spec], indent=1, default=str) + "\n")

    def describe(self) -> dict[str, Any]:
        """The ``cache`` section of the result: where entries are and how to find them."""
        section = {
            "dir": str(results_root()),
            "methods": {m.spec: self.method_keys[m.spec] for m in self.methods},
            "reference": self.method_keys.get(self.reference),
            "evaluators": dict(self.evaluator_keys),
            "examples": dict(self.example_keys),
            "hits": {m.spec: self.hits[m.spec] for m in self.methods},
        }
        if self.write_error is not None:
            section["write_error"] = self.write_error
        return section


def cached_rows(document: Mapping[str, Any], spec: str, example_id: str) -> dict[str, Any] | None:
    """An example's tokens and rows for one method, looked up through a result's ``cache``."""
    section = document.get("cache") or {}
    method_key = (section.get("methods") or {}).get(spec)
    example = (section.get("examples") or {}).get(example_id)
    if not method_key or not example:
        return None
    return read_entry(Path(section["dir"]) / method_key / f"{example}.json", repair=False)


def clear(include_models: bool = False) -> tuple[int, int]:
    """Delete cached results (and fine-tuned models): (result entries removed, bytes freed)."""
    targets = [results_root()] + ([cache_root() / "models"] if include_models else [])
    entries = size = 0
    for target in targets:
        if not target.exists():
            continue
        for path in target.rglob("*"):
            if path.is_file():
                is_entry = target.name == RESULTS_DIR and path.name != "key.json"
                entries += is_entry and path.suffix == ".json"
                size += path.stat().st_size
        shutil.rmtree(target)
    return entries, size
