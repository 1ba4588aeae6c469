"""One call to load any supported source into checked canonical records.

:func:`read_source` picks the reader for a file (by its name, or ``reader=``), runs it,
then checks every record against the schema (``check_op_records`` /
``check_run_records``), resolving device names through ``resolve_gpu`` when given. Rows
the reader or the checks refuse come back in ``rejected`` with their reasons.

Example::

    from perfcast.data.sources import read_source
    from perfcast.features.hardware_spec import resolve_gpu_name

    loaded = read_source("../shared/data/neusight_kernels_gemm.csv.gz", resolve_gpu=resolve_gpu_name)
    loaded.records, loaded.rejected, loaded.kind
"""

from __future__ import annotations

import fnmatch
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from perfcast.data.records import ReadResult
from perfcast.data.validate import GpuResolver, check_op_records, check_run_records
from perfcast.errors import DatasetError


@dataclass(frozen=True)
class SourceReader:
    """A registered reader: its name, record kind, file-name patterns and function."""

    name: str
    kind: str  # "ops" or "runs"
    patterns: tuple[str, ...]
    target: str  # "module:function" under perfcast.data.readers
    description: str
    required: tuple[str, ...] = ()  # keyword arguments the user must give (e.g. the GPU of a log)

    def load(self) -> Callable[..., ReadResult]:
        """Import the reader function (lazily: readers pull in their own dependencies)."""
        module, func = self.target.split(":")
        return getattr(importlib.import_module(f"perfcast.data.readers.{module}"), func)


READERS: tuple[SourceReader, ...] = (
    SourceReader("neusight-gemm", "ops", ("neusight_kernels_gemm*.csv*",), "neusight:read_neusight_gemm",
                 "NeuSight fp32 bmm/linear kernel latencies"),
    SourceReader("neusight-vector", "ops", ("neusight_kernels_vector*.csv*",), "neusight:read_neusight_vector",
                 "NeuSight fp32 element-wise, softmax and layernorm latencies"),
    SourceReader("neusight-model-ops", "ops", ("neusight_model_op_latency*.csv*",),
                 "neusight:read_neusight_model_ops", "NeuSight per-node fw/bw latencies of 1-layer HF models"),
    SourceReader("neusight-e2e", "runs", ("neusight_e2e_latency*.csv*",), "neusight:read_neusight_e2e",
                 "NeuSight whole-model fw(+bw) latencies, 1 GPU and 4-GPU DP/TP/PP"),
    SourceReader("vtrain-iterations", "runs", ("vtrain_megatron_iteration_time*.csv*",),
                 "vtrain:read_vtrain_iterations", "vTrain Megatron-DeepSpeed iteration times, 2-8 A100"),
    SourceReader("vtrain-nccl", "ops", ("vtrain_nccl_allreduce*.csv*",), "vtrain:read_vtrain_nccl",
                 "vTrain nccl-tests all-reduce tables, A100 and V100"),
    SourceReader("vidur-ops", "ops", ("vidur_llm_layer_ops*.csv*",), "vidur:read_vidur_ops",
                 "Vidur fp16 per-op times of transformer layers"),
    SourceReader("vidur-collectives", "ops", ("vidur_collectives*.csv*",), "vidur:read_vidur_collectives",
                 "Vidur fp16 all-reduce and send/recv times"),
    SourceReader("mlperf-llm-runs", "runs", ("mlperf_training_llm_runs*.csv*",), "mlperf:read_mlperf_llm_runs",
                 "MLPerf Training LLM runs (GPT-3 175B, Llama-2-70B LoRA)"),
    SourceReader("mlperf-llm-systems", "runs", ("mlperf_training_llm_systems*.csv*",),
                 "mlperf:read_mlperf_llm_systems", "MLPerf Training LLM results per system"),
    SourceReader("mlperf-bert-runs", "runs", ("mlperf_training_bert_runs*.csv*",), "mlperf:read_mlperf_bert_runs",
                 "MLPerf Training BERT runs"),
    SourceReader("mlperf-bert-systems", "runs", ("mlperf_training_bert_systems*.csv*",),
                 "mlperf:read_mlperf_bert_systems", "MLPerf Training BERT results per system"),
    SourceReader("published-steps", "runs", ("published_llm_training_steps*.csv*",),
                 "published_steps:read_published_steps",
                 "Published step times of llm-foundry, torchtitan, NeMo, NeMo AutoModel and MaxText"),
    SourceReader("deepbench-gemm", "ops", ("deepbench_gemm*.csv*",), "deepbench:read_deepbench_gemm",
                 "DeepBench GEMM times, older GPUs"),
    SourceReader("deepbench-allreduce", "ops", ("deepbench_allreduce*.csv*",), "deepbench:read_deepbench_allreduce",
                 "DeepBench all-reduce times, 2-32 GPUs"),
    SourceReader("torch-trace", "ops", ("*.pt.trace.json", "*.pt.trace.json.gz", "*trace*.json", "*trace*.json.gz"),
                 "torch_trace:read_torch_trace", "torch.profiler Kineto chrome trace (record_shapes=True)"),
    SourceReader("nsys-sqlite", "ops", ("*.sqlite",), "nsys:read_nsys_sqlite",
                 "Nsight Systems SQLite export with PyTorch NVTX ranges", ("dtype",)),
    SourceReader("megatron-log", "runs", ("*megatron*.log", "*megatron*.txt"), "training_logs:read_megatron_log",
                 "Megatron-LM training log (arguments block and iteration lines)", ("gpu",)),
    SourceReader("nemo-log", "runs", ("*nemo*.log", "*nemo*.txt"), "training_logs:read_nemo_log",
                 "NeMo training log (config dump and train_step_timing)", ("gpu",)),
)  # fmt: skip


@dataclass(frozen=True)
class LoadedSource:
    """Checked records of one source file."""

    reader: SourceReader
    records: pd.DataFrame
    rejected: pd.DataFrame
    n_read: int

    @property
    def kind(self) -> str:
        """``"ops"`` or ``"runs"``."""
        return self.reader.kind


def get_reader(name: str) -> SourceReader:
    """The registered reader called ``name``; DatasetError lists the names."""
    for reader in READERS:
        if reader.name == name:
            return reader
    names = ", ".join(r.name for r in READERS)
    raise DatasetError(f"reader={name!r} is not a known reader; allowed: {names}")


def detect_reader(path: str | Path) -> SourceReader:
    """The reader whose file-name pattern matches ``path``'s name."""
    name = Path(path).name.lower()
    for reader in READERS:
        if any(fnmatch.fnmatch(name, pattern) for pattern in reader.patterns):
            return reader
    names = ", ".join(r.name for r in READERS)
    raise DatasetError(f"no reader recognises the file name {Path(path).name!r}; pass one of: {names}")


def read_source(
    path: str | Path,
    *,
    reader: str | None = None,
    resolve_gpu: GpuResolver | None = None,
    **options: Any,
) -> LoadedSource:
    """Read one source file into checked canonical records (see the module docstring).

    Args:
        path: the file.
        reader: a registered reader name; detected from the file name when omitted.
        resolve_gpu: maps device names to catalog ids (records of unknown devices are rejected).
        options: reader-specific keywords (``device`` for traces, ``gpu`` for logs ...).

    Raises:
        DatasetError: unknown reader, unreadable file or missing columns.
    """
    chosen = get_reader(reader) if reader else detect_reader(path)
    missing = [opt for opt in chosen.required if options.get(opt) is None]
    if missing:
        raise DatasetError(f"reader {chosen.name} needs {', '.join(f'--{m}' for m in missing)}")
    result = chosen.load()(path, **{k: v for k, v in options.items() if v is not None})
    check = check_op_records if chosen.kind == "ops" else check_run_records
    try:
        checked = check(result.records, resolve_gpu=resolve_gpu)
    except DatasetError as exc:
        raise DatasetError(f"{path} ({chosen.name}): {exc}") from None
    rejected = pd.concat([result.rejected, checked.rejected], ignore_index=True)
    return LoadedSource(
        reader=chosen,
        records=checked.records,
        rejected=rejected,
        n_read=result.n_records + result.n_rejected,
    )
