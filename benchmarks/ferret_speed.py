"""Speed and memory against ferret 0.4.2, side by side, on the same work (issue 14).

The same model directory (the MiniLM SST-2 classifier of benchmarks/evaluators.py, cached), the
first ``--limit`` SST-2 dev sentences, the predicted class, and identical settings on both sides.
Long inputs (issue 29): ``--reviews N`` takes the first ``--limit`` ERASER movie reviews (val) of
at least N tokens instead, each cut to its first N - 2 word pieces (the text up to the last one's
end, kept only where the cut text tokenises to exactly N tokens again), so both sides read the
same N tokens; ``--loo-tau`` adds ferret's ``TauLOO_Evaluation`` and attrib-bench's
``loo-tau:removal=retokenize`` (ferret's decode round trip) on both sides.

- ferret 0.4.2, in its own environment (benchmarks/ferret_protocol.py's ``ferret_python``):
  ``Benchmark(model, tokenizer)`` with ``GradientExplainer(multiply_by_inputs=False)``,
  ``GradientExplainer(multiply_by_inputs=True)`` and ``IntegratedGradientExplainer`` (its
  default ``multiply_by_inputs=True``; Captum's default ``n_steps=50``, Gauss-Legendre, one
  batch of all 50 points, forwarded 8 at a time), the class ``Benchmark.score`` predicts,
  evaluated by ``AOPC_Comprehensiveness_Evaluation`` and ``AOPC_Sufficiency_Evaluation`` with
  their default arguments, one sentence at a time;
- attrib-bench (``attrib-bench run``): the same three methods where ferret attributes (the
  word-embedding lookup's output) and reduces the hidden dimension (Captum's ``Saliency`` takes
  absolute values, then ferret sums: ``abs-sum``; gradient x input and IG: signed ``sum``), IG
  from the [CLS] [PAD]... [SEP] baseline at 50 steps, both evaluators under ``protocol=ferret``
  (ratios 10%..100%), the default run target (the predicted class's logit), ``--no-floor
  --no-cache --agreement-k 0``, the reference one of the three methods (no extra row).

``--repeats`` pairs of fresh processes run alternately (ferret, attrib-bench, ferret, ...), each
timed end to end (interpreter start, imports and model load included) with ``OMP_NUM_THREADS=
--threads`` and this environment's OMP_WAIT_POLICY (unset: libgomp's default), which the floor
below shares. Peak memory is each process's own ``VmHWM`` (/proc/self/status, read at exit by a
wrapper in the process): ``ru_maxrss`` would not do, since a child inherits its parent's peak
at exec. The per-example AOPC of the two sides are compared (the largest difference is
printed), so the comparison is of identical work.

The compute floor of each method, measured in this process after each pair on the runner's
batches (``make_batches``: ``--batch-size`` length-sorted sentences): per batch one forward pass
and one backward pass of the predicted class's logits, summed over the batch, to the
word-embedding output (gradient, gradient x input: one such pass serves both), and for IG a
forward pass for the class plus ``steps`` forward+backward passes of the whole batch along the
path. Every floor runs PyTorch's scaled-dot-product attention (sdpa), the fastest attention
torch has on the CPU, as attrib-bench's passes do where no attention probabilities are read
(attrib_bench.core.attention_kernels); ``--eager-floor`` also times IG's floor with the eager
attention every model loads with. attrib-bench's per-method seconds are its standalone seconds
(``methods[spec]["seconds_per_example"]`` times the examples); the ratio to the floor is taken
per pair (the same load on both), and its median reported.

The evaluators' floor: forward passes of the distinct inputs the two evaluators erase to, over
every example, method and step (ferret's decode round trip applied, duplicates dropped), those
of one length together with no padding; attrib-bench's evaluators are timed against it in this
process on the same batches and attributions (its result JSON does not time evaluators).
Startup (interpreter, imports, plugin registry, model and data: ``STARTUP``) is timed in a
fresh process after each pair. The full ceiling is ferret's time over startup plus every floor:
no run of this work, by any tool, can beat it by removing work.

    python benchmarks/ferret_speed.py [--limit 100] [--repeats 3] [--threads 2]
        [--batch-size 32] [--reviews N] [--loo-tau] [--eager-floor] [--model DIR] [--venv DIR]
        [--output benchmarks/results/ferret_speed.json]

    # issue 29's long inputs: 24 reviews of 255 tokens, LOO-tau too
    python benchmarks/ferret_speed.py --limit 24 --reviews 255 --loo-tau --eager-floor \
        --repeats 1 --output benchmarks/results/ferret_speed_reviews.json

Outputs: the JSON at ``--output`` and the Markdown beside it (.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from evaluators import DATA, sst2_model  # the same cached SST-2 classifier
from ferret_protocol import ferret_python  # ferret 0.4.2's environment

from attrib_bench import Batch, EvalContext
from attrib_bench.core.attention_kernels import EAGER, FAST, attention_implementation
from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.registry import Spec, load_registry
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model
from attrib_bench.model.trace import trace_batch
from attrib_bench.results import write_json
from attrib_bench.toolkit.erasure import CACHE_KEY, erase
from attrib_bench_plugins.faithfulness import Comprehensiveness, Sufficiency
from attrib_bench_plugins.gradient import Gradient, IntegratedGradients, Saliency
from attrib_bench_plugins.loo import LooTau

#: The model families of the installed plugins, as ``load_model`` takes them.
ARCHITECTURES = load_registry().architecture_specs()

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = 50
#: Method -> (attrib-bench spec, ferret's explainer name).
METHODS = {
    "gradient": ("gradient:reduce=abs-sum,layer=word_embeddings", "Gradient"),
    "gradient x input": ("saliency:reduce=sum,layer=word_embeddings", "Gradient (x Input)"),
    "integrated gradients": (
        f"integrated-gradients:steps={STEPS},reduce=sum,layer=word_embeddings",
        "Integrated Gradient (x Input)",
    ),
}
#: attrib-bench evaluator spec -> ferret's short name of the same evaluator.
EVALUATORS = {
    "comprehensiveness:protocol=ferret": "aopc_compr",
    "sufficiency:protocol=ferret": "aopc_suff",
}
#: ``--loo-tau``: attrib-bench's LOO-tau under ferret's decode round trip, ferret's short name.
LOO_TAU = {"loo-tau:removal=retokenize": "taucorr_loo"}
#: ferret's evaluator classes by short name.
FERRET_EVALUATORS = {
    "aopc_compr": "AOPC_Comprehensiveness_Evaluation",
    "aopc_suff": "AOPC_Sufficiency_Evaluation",
    "taucorr_loo": "TauLOO_Evaluation",
}
#: The classes behind the specs, for the floor's in-process runs.
METHOD_CLASSES = {
    "gradient": Gradient,
    "gradient x input": Saliency,
    "integrated gradients": IntegratedGradients,
}
EVALUATOR_CLASSES = {
    "comprehensiveness:protocol=ferret": Comprehensiveness,
    "sufficiency:protocol=ferret": Sufficiency,
    "loo-tau:removal=retokenize": LooTau,
}
#: Tokens per forward pass of erased inputs (the evaluators' default ``chunk_tokens``).
CHUNK_TOKENS = 8192

#: What any run of this work does before its first batch, timed in a fresh process: the
#: interpreter, attrib-bench's run path and Captum imported, the plugin registry, the model and
#: the sentences loaded.
STARTUP = r"""
import sys
import captum.attr
import attrib_bench.cli, attrib_bench.runner.engine
from attrib_bench.core.registry import load_registry
from attrib_bench.data.load import load_examples
from attrib_bench.model.load import load_model
architectures = load_registry().architecture_specs()
load_model(sys.argv[1], "cpu", architectures=architectures)
load_examples(sys.argv[2], "dev", limit=int(sys.argv[3]))
"""

#: Runs a script (``path``) or a module's ``__main__`` (``-m name``) in this process, then writes
#: the process's own peak resident set (VmHWM) and torch's thread count to ``stats``.
WRAPPER = r"""
import json, runpy, sys
stats, *command = sys.argv[1:]
module = command[0] == "-m"
sys.argv = command[1:] if module else command
try:
    if module:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    with open("/proc/self/status") as status:
        peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    with open(stats, "w") as handle:
        json.dump({"peak_rss_mb": peak_kb / 1024, "torch_threads": threads}, handle)
"""

#: ferret's side, run by the ferret environment's Python: its Benchmark on every sentence.
FERRET_SIDE = r"""
import importlib.metadata, json, sys
from transformers import AutoModelForSequenceClassification, AutoTokenizer
import ferret
from ferret import Benchmark, GradientExplainer, IntegratedGradientExplainer

model_dir, sentences_path, output, evaluator_classes = sys.argv[1:]
model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
tokenizer = AutoTokenizer.from_pretrained(model_dir)
bench = Benchmark(
    model,
    tokenizer,
    explainers=[
        GradientExplainer(model, tokenizer, multiply_by_inputs=False),
        GradientExplainer(model, tokenizer, multiply_by_inputs=True),
        IntegratedGradientExplainer(model, tokenizer),
    ],
    evaluators=[getattr(ferret, name)(model, tokenizer) for name in evaluator_classes.split(",")],
)
examples = {}
for line in open(sentences_path):
    record = json.loads(line)
    target = int(bench.score(record["text"], return_dict=False).argmax())
    explanations = bench.explain(record["text"], target=target, show_progress=False)
    evaluations = bench.evaluate_explanations(explanations, target=target, show_progress=False)
    examples[record["id"]] = {
        "target": target,
        **{e.explanation.explainer: {s.name: float(s.score) for s in e.evaluation_scores}
           for e in evaluations},
    }
versions = {name: __import__(name).__version__
            for name in ("transformers", "torch", "numpy", "captum")}
versions["ferret-xai"] = importlib.metadata.version("ferret-xai")
json.dump({"versions": versions, "examples": examples}, open(output, "w"))
"""


def machine() -> dict:
    """What the numbers were measured on. Not method_cost.py's ``machine``: importing that
    module sets OMP_WAIT_POLICY for this process's children only (torch is loaded here first),
    and the floor measured here must wait for threads as both sides do."""
    with open("/proc/cpuinfo") as handle:
        cpu = next((line.split(":", 1)[1].strip() for line in handle if "model name" in line), "")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }


def sentences(limit: int) -> list[dict]:
    """The first ``limit`` SST-2 dev sentences, with the ids attrib-bench gives them."""
    examples = load_examples(str(DATA / "sst2"), "dev", limit=limit).examples
    return [{"id": e.id, "text": e.text} for e in examples]


def reviews(limit: int, length: int, model: str) -> list[dict]:
    """The first ``limit`` ERASER movie reviews (val) cut to exactly ``length`` tokens with the
    model's tokenizer (module docstring), with their labels."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    kept = []
    for example in load_examples(str(DATA / "eraser_movies"), "val").examples:
        pieces = tokenizer(example.text, add_special_tokens=False, return_offsets_mapping=True)
        if len(pieces["input_ids"]) < length - 2:
            continue
        text = example.text[: pieces["offset_mapping"][length - 3][1]]
        if len(tokenizer(text)["input_ids"]) == length:
            kept.append({"id": example.id, "text": text, "label": example.label})
        if len(kept) == limit:
            return kept
    raise SystemExit(f"only {len(kept)} reviews of {length} tokens; lower --limit")


def timed(command: list[str], environment: dict[str, str], stats: Path) -> dict:
    """One fresh process through ``WRAPPER``: wall seconds, its user and system CPU seconds, its
    own peak, the load around it."""
    load_before = os.getloadavg()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [command[0], "-c", WRAPPER, str(stats), *command[1:]],
        env=environment,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # this child's, waited for
    return {
        "seconds": round(seconds, 2),
        "user_seconds": round(after.ru_utime - usage.ru_utime, 2),
        "system_seconds": round(after.ru_stime - usage.ru_stime, 2),
        **json.loads(stats.read_text()),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def run_ferret(
    python: Path, model: str, records: Path, folder: Path, environment: dict, evaluators: dict
) -> tuple:
    script, output = folder / "ferret_side.py", folder / "ferret.json"
    script.write_text(FERRET_SIDE)
    classes = ",".join(FERRET_EVALUATORS[short] for short in evaluators.values())
    command = [str(python), str(script), model, str(records), str(output), classes]
    measured = timed(command, environment, folder / "ferret_stats.json")
    return measured, json.loads(output.read_text())


def run_ours(
    model: str, args: argparse.Namespace, folder: Path, environment: dict, dataset: Path
) -> tuple:
    output = folder / "attrib_bench.json"
    specs = [spec for spec, _ in METHODS.values()]
    command = [
        sys.executable,
        "-m",
        "attrib_bench.cli",
        "run",
        "--model",
        model,
        "--dataset",
        str(dataset),
        "--split",
        "dev",
        "--limit",
        str(args.limit),
        "--attributors",
        ",".join(specs),
        "--evaluators",
        ",".join(args.evaluators),
        "--reference",
        specs[1],
        "--batch-size",
        str(args.batch_size),
        "--device",
        "cpu",
        "--no-floor",
        "--no-cache",
        "--agreement-k",
        "0",
        "--quiet",
        "--output",
        str(output),
    ]
    measured = timed(command, environment, folder / "attrib_bench_stats.json")
    return measured, json.loads(output.read_text())


class Floor:
    """The plain passes each method needs at least (module docstring), on the runner's batches,
    with the model loaded once; ``measure`` times them once. ``evaluators``: attrib-bench's
    evaluator specs (``EVALUATORS`` and perhaps ``LOO_TAU``); None prepares the method passes
    alone (benchmarks/gradient_floor.py). ``eager_floor``: ``measure`` also times IG's floor
    under eager attention."""

    def __init__(
        self,
        model: str,
        limit: int,
        batch_size: int,
        evaluators: dict[str, str] | None = EVALUATORS,
        dataset: Path = DATA / "sst2",
        eager_floor: bool = False,
    ) -> None:
        self.loaded = load_model(model, "cpu", architectures=ARCHITECTURES)
        self.eager_floor = eager_floor
        #: The attention implementation of the method floors' passes.
        self.attention = FAST
        examples = load_examples(str(dataset), "dev", limit=limit).examples
        tokenizer, length = self.loaded.tokenizer, self.loaded.max_length
        self.batches, _ = make_batches(examples, tokenizer, batch_size, length)
        self.lookup = self.loaded.model.get_input_embeddings()
        self.gradient(self.batches[0])  # warm-up
        if evaluators is None:
            return
        self.methods = [
            METHOD_CLASSES[label]().configure(dict(Spec.parse(spec).params))
            for label, (spec, _) in METHODS.items()
        ]
        self.evaluators = [
            EVALUATOR_CLASSES[spec]().configure(dict(Spec.parse(spec).params))
            for spec in evaluators
        ]
        self.attributions = [
            [self.attribute(m, batch) for m in self.methods] for batch in self.batches
        ]
        self.erased_inputs = self.distinct_erasures()

    def backward(
        self, embedded: torch.Tensor, batch: Batch, classes: torch.Tensor | None
    ) -> torch.Tensor:
        """One forward and one backward pass of the classes' logits (predicted when None), under
        ``self.attention``."""
        embedded = embedded.detach().requires_grad_()
        with attention_implementation(self.loaded.model, self.attention):
            logits = self.loaded.model(
                inputs_embeds=embedded,
                attention_mask=batch.attention_mask_BN,
                token_type_ids=batch.token_type_ids_BN,
            ).logits
        classes = logits.argmax(-1) if classes is None else classes
        torch.autograd.grad(logits.gather(1, classes[:, None]).sum(), embedded)
        return classes

    def gradient(self, batch: Batch) -> None:
        """Gradient and gradient x input: the gradient at the embeddings (times them)."""
        self.backward(self.lookup(batch.input_ids_BN), batch, None)

    def integrated(self, batch: Batch) -> None:
        """The predicted class, then ``STEPS`` passes of the batch along the path."""
        embedded = self.lookup(batch.input_ids_BN).detach()
        with torch.no_grad(), attention_implementation(self.loaded.model, self.attention):
            classes = self.loaded.model(**batch.model_inputs()).logits.argmax(-1)
        pad = self.loaded.tokenizer.pad_token_id
        keep = batch.special_tokens_mask_BN.bool()
        baseline = self.lookup(torch.where(keep, batch.input_ids_BN, pad)).detach()
        for step in range(STEPS):
            alpha = (step + 0.5) / STEPS
            self.backward(baseline + alpha * (embedded - baseline), batch, classes)

    def attribute(self, method, batch: Batch):
        """attrib-bench's method on one batch, as the runner calls it (not timed)."""
        trace = trace_batch(self.loaded, batch, method.requires)
        attribution = method.attribute(trace)
        trace.release_graph()
        return attribution

    def evaluate(self) -> tuple[float, list]:
        """attrib-bench's two evaluators on the three methods' attributions, in this process on
        fresh traces (no erasure cached yet), in the runner's order (every pair's ``plan``, then
        every ``score``): their seconds, and the traces, whose erasure caches hold every erased
        input they ran."""
        traces = [trace_batch(self.loaded, batch, set()) for batch in self.batches]
        start = time.perf_counter()
        for trace, attributions in zip(traces, self.attributions, strict=True):
            for stage in ("plan", "score"):  # as the runner does: every pair's plan first
                for evaluator in self.evaluators:
                    run = getattr(evaluator, stage, None)  # plan is optional (loo-tau has none)
                    for method, attribution in zip(self.methods, attributions, strict=True):
                        if run is not None:
                            run(attribution, EvalContext(trace, None, 0, method))
        return time.perf_counter() - start, traces

    def distinct_erasures(self) -> dict[int, list[tuple[int, ...]]]:
        """The erased inputs the evaluators need, by length: the distinct token sequences after
        ferret's round trip, over every example, method, evaluator and step."""
        _, traces = self.evaluate()
        by_length: dict[int, set[tuple[int, ...]]] = {}
        for trace in traces:
            inputs, special_BN = trace.batch.model_inputs(), trace.batch.special_tokens_mask_BN
            for removal, b, mask in trace.shared[CACHE_KEY]:
                erase_1N = torch.as_tensor(np.frombuffer(mask, dtype=bool).copy())[None]
                one = {name: tensor[b : b + 1] for name, tensor in inputs.items()}
                erased = erase(one, erase_1N, removal, self.loaded.tokenizer, special_BN[b : b + 1])
                ids = erased["input_ids"][0][erased["attention_mask"][0].bool()].tolist()
                by_length.setdefault(len(ids), set()).add(tuple(ids))
        return {n: sorted(sequences) for n, sequences in sorted(by_length.items())}

    def erasure_passes(self) -> None:
        """The evaluators' floor: forward passes of the distinct erased inputs alone, those of one
        length together (no padding), at most ``CHUNK_TOKENS`` tokens a pass."""
        with torch.inference_mode(), attention_implementation(self.loaded.model, FAST):
            for n, sequences in self.erased_inputs.items():
                step = max(1, CHUNK_TOKENS // n)
                for start in range(0, len(sequences), step):
                    ids = torch.tensor(sequences[start : start + step])
                    self.loaded.model(input_ids=ids, attention_mask=torch.ones_like(ids))

    def measure(self) -> dict[str, float]:
        """Seconds per method over every batch (one gradient pass serves both gradient methods),
        the evaluators' floor, and attrib-bench's evaluators in this process."""
        seconds = {}
        for name, passes in (("gradient", self.gradient), ("integrated", self.integrated)):
            start = time.perf_counter()
            for batch in self.batches:
                passes(batch)
            seconds[name] = time.perf_counter() - start
        eager = {}
        if self.eager_floor:
            self.attention = EAGER
            start = time.perf_counter()
            for batch in self.batches:
                self.integrated(batch)
            eager = {"integrated gradients, eager attention": time.perf_counter() - start}
            self.attention = FAST
        start = time.perf_counter()
        self.erasure_passes()
        erasures = time.perf_counter() - start
        evaluators, _ = self.evaluate()
        return {
            "gradient": seconds["gradient"],
            "gradient x input": seconds["gradient"],
            "integrated gradients": seconds["integrated"],
            **eager,
            "evaluators": erasures,
            "attrib_bench_evaluators": evaluators,
        }


def agreement(ours: dict, theirs: dict, tolerance: float, evaluators: dict) -> list[dict]:
    """Per method and evaluator, the per-example score differences between the two sides."""
    ids = ours["example_ids"]
    rows = []
    for label, (spec, explainer) in METHODS.items():
        per_example = ours["methods"][spec]["per_example"]
        for evaluator, short in evaluators.items():
            values = per_example[evaluator]["aggregated"][0]
            differences = [
                abs(value - theirs["examples"][i][explainer][short])
                for i, value in zip(ids, values, strict=True)
            ]
            rows.append(
                {
                    "method": label,
                    "evaluator": evaluator,
                    "max_abs_difference": max(differences),
                    "mean_abs_difference": statistics.fmean(differences),
                    "over_tolerance": sum(d > tolerance for d in differences),
                }
            )
    return rows


def markdown(result: dict, command: str) -> str:
    runs, summary = result["runs"], result["summary"]
    setup = result["setup"]
    lines = [
        "# attrib-bench against ferret 0.4.2: speed and memory on the same work",
        "",
        f"The first {result['examples']} {result['data']}, MiniLM-L6 fine-tuned on SST-2 "
        "(benchmarks/evaluators.py's model), the predicted class; gradient, gradient x input and "
        f"Integrated Gradients ({STEPS} steps) at the word-embedding output, AOPC "
        "comprehensiveness and sufficiency under ferret's protocol (10%..100%)"
        + (", LOO-tau (ferret's `taucorr_loo`, its decode round trip)" if setup["loo_tau"] else "")
        + ". Each run is a fresh process timed end to end (imports and model load included), "
        f"OMP_NUM_THREADS={setup['threads']} (OMP_WAIT_POLICY "
        f"{result['machine']['omp_wait_policy'] or 'unset'}), attrib-bench batch size "
        f"{setup['batch_size']}; "
        "peak = the process's own VmHWM. ferret ran in its own environment: "
        + ", ".join(f"{k} {v}" for k, v in sorted(result["ferret_environment"].items()))
        + "; attrib-bench: "
        + ", ".join(f"{k} {v}" for k, v in sorted(result["attrib_bench_environment"].items()))
        + f". CPU: {result['machine']['cpu']}.",
        "",
        "| pair | side | seconds | user s | system s | peak MB | torch threads | load before "
        "| load after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, run in enumerate(runs, 1):
        for side in ("ferret", "attrib-bench"):
            cell = run[side]
            lines.append(
                f"| {pair} | {side} | {cell['seconds']:.1f} | {cell.get('user_seconds', '')} "
                f"| {cell.get('system_seconds', '')} | {cell['peak_rss_mb']:.0f} "
                f"| {cell['torch_threads']} | {cell['load_before'][0]:.2f} "
                f"| {cell['load_after'][0]:.2f} |"
            )
    lines += [
        "",
        "| | per pair | median |",
        "|---|---|---|",
        "| seconds, ferret / attrib-bench | "
        + ", ".join(f"{r:.2f}" for r in summary["seconds_ratios"])
        + f" | **{summary['median_seconds_ratio']:.2f}** |",
        "| peak MB, attrib-bench / ferret | "
        + ", ".join(f"{r:.2f}" for r in summary["peak_ratios"])
        + f" | **{summary['median_peak_ratio']:.2f}** |",
        "| ceiling: ferret seconds / IG's floor alone (no run that computes IG can do better) | "
        + ", ".join(f"{r:.2f}" for r in summary["ceilings"])
        + f" | **{summary['median_ceiling']:.2f}** |",
        "| ceiling: ferret seconds / (startup + every floor below: IG, one gradient pass, the "
        "distinct erased inputs) | "
        + ", ".join(f"{r:.2f}" for r in summary["floor_ceilings"])
        + f" | **{summary['median_floor_ceiling']:.2f}** |",
        "",
        "Per method: attrib-bench's standalone seconds (the batch's forward pass and the "
        "method's own time, from the result JSON) against the compute floor measured right after "
        f"each pair (per batch of {setup['batch_size']}: one forward and one backward pass, "
        f"which serve both gradient methods; IG: the forward and {STEPS} forward+backward "
        "passes of the batch), every floor under sdpa attention, the eager-attention row "
        "the same IG floor under the eager attention models load with; medians over the pairs. "
        "The evaluators' row is attrib-bench's evaluators on the three methods' attributions, "
        "timed in the benchmark's process on the same batches, against forward passes of the "
        "distinct inputs they erase to "
        "(ferret's round trip done, duplicates over examples, methods and steps dropped), "
        f"those of one length together without padding, at most {CHUNK_TOKENS} tokens a pass.",
        "",
        "| method | attrib-bench s | floor s | ratio per pair | median ratio |",
        "|---|---|---|---|---|",
    ]
    for row in result["methods"]:
        lines.append(
            f"| {row['method']} | {row['attrib_bench_seconds']:.2f} | {row['floor_seconds']:.2f} "
            f"| {', '.join(f'{r:.2f}' for r in row['ratios'])} | **{row['median_ratio']:.2f}** |"
        )
    startup = statistics.median(result["startup_seconds"])
    rest = statistics.median(result["attrib_bench_rest_seconds"])
    lines += [
        f"| startup (a fresh process: imports, plugin registry, model and data) | {startup:.2f} "
        "| | | |",
        f"| the rest of attrib-bench's run (its total less the rows above, one gradient pass "
        f"counted) | {rest:.2f} | | | |",
    ]
    tolerance = setup["tolerance"]
    lines += [
        "",
        f"Same numbers (last pair): per-example scores, ferret against attrib-bench "
        f"(examples differing by more than {tolerance:g}).",
        "",
        "| method | evaluator | max abs difference | mean abs difference | over tolerance |",
        "|---|---|---|---|---|",
    ]
    for row in result["agreement"]:
        lines.append(
            f"| {row['method']} | `{row['evaluator']}` | {row['max_abs_difference']:.2e} "
            f"| {row['mean_abs_difference']:.2e} | {row['over_tolerance']} |"
        )
    lines += ["", f"`{command}`: {result['seconds']} s."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of both sides")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=32,
        help="attrib-bench's (32: larger passes for IG's steps and the pooled erasures than 16)",
    )
    parser.add_argument("--tolerance", type=float, default=1e-4, help="per-example scores")
    parser.add_argument(
        "--reviews",
        type=int,
        metavar="N",
        help="ERASER movie reviews cut to N tokens (long inputs)",
    )
    parser.add_argument("--loo-tau", action="store_true", help="LOO-tau on both sides too")
    parser.add_argument("--eager-floor", action="store_true", help="IG's floor also eager")
    parser.add_argument("--model", help="classifier directory (default: fine-tuned, cached)")
    parser.add_argument("--venv", type=Path, default=cache_root() / "ferret-venv")
    parser.add_argument("--output", type=Path, default=RESULTS / "ferret_speed.json")
    args = parser.parse_args()
    args.evaluators = {**EVALUATORS, **(LOO_TAU if args.loo_tau else {})}
    start = time.perf_counter()
    python, _ = ferret_python(args.venv)
    model = args.model or sst2_model("cpu")
    environment = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    torch.set_num_threads(args.threads)
    measured_on = machine()
    runs = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        records = folder / "sentences.jsonl"
        if args.reviews:  # attrib-bench reads the same texts as a dataset folder
            dataset = folder / "reviews"
            dataset.mkdir()
            texts = reviews(args.limit, args.reviews, model)
            (dataset / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in texts))
        else:
            dataset, texts = DATA / "sst2", sentences(args.limit)
        records.write_text("".join(json.dumps(r) + "\n" for r in texts))
        floor = Floor(
            model, args.limit, args.batch_size, args.evaluators, dataset, args.eager_floor
        )
        startup = folder / "startup.py"
        startup.write_text(STARTUP)
        startup_command = [sys.executable, str(startup), model, str(dataset), str(args.limit)]
        for pair in range(args.repeats):
            measured_theirs, theirs = run_ferret(
                python, model, records, folder, environment, args.evaluators
            )
            measured_ours, ours = run_ours(model, args, folder, environment, dataset)
            measured_ours["method_seconds"] = {
                label: ours["methods"][spec]["seconds_per_example"] * len(ours["example_ids"])
                for label, (spec, _) in METHODS.items()
            }
            measured_startup = timed(startup_command, environment, folder / "startup.json")
            load_before = [round(x, 2) for x in os.getloadavg()]
            floor_seconds = floor.measure()
            runs.append(
                {
                    "ferret": measured_theirs,
                    "attrib-bench": measured_ours,
                    "startup": measured_startup,
                    "floor": {
                        "method_seconds": floor_seconds,
                        "load_before": load_before,
                        "load_after": [round(x, 2) for x in os.getloadavg()],
                    },
                }
            )
            print(
                f"pair {pair + 1}: ferret {measured_theirs['seconds']:.1f} s "
                f"{measured_theirs['peak_rss_mb']:.0f} MB, attrib-bench "
                f"{measured_ours['seconds']:.1f} s {measured_ours['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    method_rows = []
    evaluators_label = "the evaluators (the three methods' erasures)"
    eager_label = "integrated gradients, eager attention"
    for label, spec in [
        *((label, spec) for label, (spec, _) in METHODS.items()),
        *([(eager_label, METHODS["integrated gradients"][0])] if args.eager_floor else []),
        (evaluators_label, ",".join(args.evaluators)),
    ]:
        if label == evaluators_label:  # attrib-bench's, timed in this process (module docstring)
            ours_seconds = [r["floor"]["method_seconds"]["attrib_bench_evaluators"] for r in runs]
            floor_seconds = [r["floor"]["method_seconds"]["evaluators"] for r in runs]
        elif label == eager_label:  # attrib-bench's IG against the eager floor
            ours_seconds = [
                r["attrib-bench"]["method_seconds"]["integrated gradients"] for r in runs
            ]
            floor_seconds = [r["floor"]["method_seconds"][label] for r in runs]
        else:
            ours_seconds = [r["attrib-bench"]["method_seconds"][label] for r in runs]
            floor_seconds = [r["floor"]["method_seconds"][label] for r in runs]
        method_rows.append(
            {
                "method": label,
                "spec": spec,
                "attrib_bench_seconds": statistics.median(ours_seconds),
                "floor_seconds": statistics.median(floor_seconds),
                "ratios": [o / f for o, f in zip(ours_seconds, floor_seconds, strict=True)],
            }
        )
        method_rows[-1]["median_ratio"] = statistics.median(method_rows[-1]["ratios"])

    def rest(run: dict) -> float:
        """attrib-bench's time less startup, IG, one gradient pass and the evaluators."""
        methods = run["attrib-bench"]["method_seconds"]
        gradient = max(methods["gradient"], methods["gradient x input"])  # one shared pass
        evaluators = run["floor"]["method_seconds"]["attrib_bench_evaluators"]
        done = run["startup"]["seconds"] + methods["integrated gradients"] + gradient + evaluators
        return run["attrib-bench"]["seconds"] - done

    def floor_total(run: dict) -> float:
        """Startup plus every floor: IG, one gradient pass, the distinct erased inputs."""
        floor = run["floor"]["method_seconds"]
        passes = floor["integrated gradients"] + floor["gradient"] + floor["evaluators"]
        return run["startup"]["seconds"] + passes

    seconds_ratios = [r["ferret"]["seconds"] / r["attrib-bench"]["seconds"] for r in runs]
    peak_ratios = [r["attrib-bench"]["peak_rss_mb"] / r["ferret"]["peak_rss_mb"] for r in runs]
    # What no run of IG at its floor can beat: ferret's time over IG's floor alone.
    ceilings = [
        r["ferret"]["seconds"] / r["floor"]["method_seconds"]["integrated gradients"] for r in runs
    ]
    # What no run of this work can beat: ferret's time over startup plus every floor.
    floor_ceilings = [r["ferret"]["seconds"] / floor_total(r) for r in runs]
    result = {
        "model": model,
        "dataset": f"eraser_movies/val, {args.reviews} tokens" if args.reviews else "sst2/dev",
        "data": (
            f"ERASER movie reviews (val) of {args.reviews} tokens"
            if args.reviews
            else "SST-2 dev sentences"
        ),
        "examples": len(ours["example_ids"]),
        "setup": {
            "threads": args.threads,
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "tolerance": args.tolerance,
            "methods": {label: spec for label, (spec, _) in METHODS.items()},
            "evaluators": args.evaluators,
            "loo_tau": args.loo_tau,
            "reviews": args.reviews,
        },
        "machine": {**measured_on, "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "ferret_environment": theirs["versions"],
        "attrib_bench_environment": ours["provenance"]["packages"],
        "runs": runs,
        "summary": {
            "seconds_ratios": seconds_ratios,
            "median_seconds_ratio": statistics.median(seconds_ratios),
            "peak_ratios": peak_ratios,
            "median_peak_ratio": statistics.median(peak_ratios),
            "ceilings": ceilings,
            "median_ceiling": statistics.median(ceilings),
            "floor_ceilings": floor_ceilings,
            "median_floor_ceiling": statistics.median(floor_ceilings),
        },
        "methods": method_rows,
        "startup_seconds": [r["startup"]["seconds"] for r in runs],
        "attrib_bench_rest_seconds": [rest(r) for r in runs],
        "agreement": agreement(ours, theirs, args.tolerance, args.evaluators),
        "seconds": round(time.perf_counter() - start, 1),
    }
    write_json(result, args.output)
    command = shlex.join(["python", "benchmarks/ferret_speed.py", *sys.argv[1:]])
    text = markdown(result, command)
    args.output.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
