"""Runs spread over processes by a launcher: ``torchrun`` or ``accelerate launch``.

``torchrun --nproc-per-node N -m attrib_bench run ...`` (or ``accelerate launch -m attrib_bench
run ...``) starts N copies of the command. Each finds the launcher's environment (WORLD_SIZE >
1), joins the process group through Hugging Face Accelerate's ``PartialState`` (gloo on CPUs,
NCCL on GPUs, one GPU per process: ``cuda:LOCAL_RANK``) and runs the shard ``--shard
rank+1/N``: a normal single-process run over a contiguous slice of the run's length-sorted
batches, with per-example seeds and per-example cache entries, so a crashed process resumes from
its cache. Every example keeps the batch companions it has in one process, so every per-example
number is the single-process run's at any batch size. The results are gathered to rank 0, which
merges them (``attrib_bench.results.merge``: dataset order restored, statistics computed after
the merge) and alone prints and writes the result, or the first process's usage error (an
empty shard when there are more processes than batches), one line. The model is built
(fine-tuned, when the run says so) by rank 0 first, the others then reading it from the cache.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, NoReturn

from attrib_bench.core.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from attrib_bench.runner.config import RunPlan

#: The variables launchers set for the size of the job (torchrun and accelerate: WORLD_SIZE).
WORLD_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")


def launched() -> bool:
    """Whether a launcher started this process as one of several."""
    return any(int(os.environ.get(name, "1")) > 1 for name in WORLD_VARIABLES)


def refuse(message: str) -> NoReturn:
    """A usage error every process of a launched job finds alike, said once: rank 0 raises it
    (one line), the others exit 2 quietly."""
    if int(os.environ.get("RANK", "0")) == 0:
        raise UsageError(message)
    raise SystemExit(int(ExitCode.USAGE_ERROR))


def _state(device: str) -> tuple[Any, str]:
    """Accelerate's process state (the process group joined) and this process's device.

    Without Accelerate every process finds it missing alike: rank 0 says so in one line (the
    others exit 2 quietly), before any process imports from it (a traceback from each before).
    """
    import torch

    try:
        from accelerate import PartialState
    except ImportError:
        refuse(
            "a run under torchrun or accelerate launch needs Accelerate: pip install "
            "'attrib-bench[distributed]'"
        )
    gpus = device in ("auto", "cuda") and torch.cuda.is_available()
    state = PartialState(cpu=not gpus)
    return state, f"cuda:{state.local_process_index}" if gpus else "cpu"


def run_sharded(plan: RunPlan, quiet: bool) -> dict[str, Any] | None:
    """This process's shard of ``plan``; the merged result on rank 0, None on the others."""
    from attrib_bench.results import Result, merge
    from attrib_bench.runner.config import build_model
    from attrib_bench.runner.models import run_config

    if plan.config.shard is not None:
        refuse("--shard picks a shard by hand; under a launcher every process has one")
    if plan.config.models:
        refuse("a run over several models (--models) runs in one process")
    state, device = _state(plan.config.device)
    from accelerate.utils import gather_object  # installed: _state found Accelerate

    main = state.is_main_process
    with state.main_process_first():  # one fine-tune, the others read it from the cache
        plan = build_model(plan, quiet=quiet or not main)
    shard = f"{state.process_index + 1}/{state.num_processes}"
    config = dataclasses.replace(plan.config, shard=shard, device=device)
    try:
        try:
            document = run_config(config, quiet=quiet or not main, cache=plan.cache)
        except UsageError as error:  # joins the gather, or its peers die on a closed socket
            document = {"usage_error": str(error)}
        documents = gather_object([document])
    finally:  # a process leaving with the group open can abort its peers' gloo sockets
        state.destroy_process_group()
    if not main:
        return None
    errors = [part["usage_error"] for part in documents if "usage_error" in part]
    if errors:  # rank 0 alone says it: one line for the job
        raise UsageError(errors[0])
    merged = merge([Result.from_document(part) for part in documents]).to_document()
    merged.update(plan.extra)
    return merged
