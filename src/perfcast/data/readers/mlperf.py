"""Readers of MLPerf Training results (LLM and BERT) as run records.

Source: ``mlcommons/training_results_v3.0`` .. ``v5.1`` extracted to ``../shared/data``
(README section 3): one row per run (``mlperf_training_{llm,bert}_runs.csv``) or per
(round, submitter, system, benchmark) (``..._systems.csv``). Measured fields come from the
MLLOG run log, hardware from ``systems/<system>.json``, the parallel layout from the
submitter's ``config_*.sh`` matched to the system (``config_match_method``).

Time statistics and units:

* ``measured_ttt_min``: time to train, minutes (``run_stop - run_start``), per run
  (``time_to_train_min``) or the median over a system's successful runs
  (``ttt_min_median_success``). These are raw times, not the official (normalised) scores.
* ``measured_step_ms``: seconds per global-batch step from the log's ``tracked_stats``
  (median over the logged steps of a run, ``step_time_s_median``; for systems the median over
  runs, ``step_time_s_median_over_runs``) times 1000. ``timing_scope`` is ``step`` when a
  step time exists, else ``time_to_train``.

Models (:data:`BENCHMARK_MODELS`), written out here because the data layer does not read the
features catalogs (tests check them against the presets):

* ``gpt3``: GPT-3 175B, preset ``gpt3-175b`` (96 layers, hidden 12288, 96 heads, ffn 49152,
  vocab 50257, seq 2048). The vocabulary is the tokenizer's; Megatron's padding to a multiple
  of 128*tp (50,688 at tp=4) is not applied (under 1 % of the model's FLOPs).
* ``llama2_70b_lora``: preset ``llama2-70b`` with ``seq_len = max_sequence_length`` when
  logged, else 8192 (NVIDIA's ``conf/base/model_config.yaml``), ``finetune = "lora"`` with
  ``lora_rank`` from the log (rows without it are rejected).
* ``llama31_405b`` / ``llama31_8b`` (v5.x, held back from the shared files): presets
  ``llama3.1-405b`` / ``llama3.1-8b``, seq from the log else 8192, full pre-training. The
  MLPerf recipe's tokenizer may differ from Llama 3.1's (vocab 128,256); not verified.
* ``bert``: BERT-large (24 layers, hidden 1024, 16 heads, ffn 4096, vocab 30522, seq =
  ``max_sequence_length`` else 512), an encoder (``architecture = "bert"``), pure data
  parallel: ``dp = num_gpus``.

Layout (LLM): ``tp, pp`` from the config (``cfg_tp, cfg_pp``), ``cp`` (``cfg_cp``, default 1),
``vpp`` (``cfg_vpp_interleave``, default 1), ``sequence_parallel`` (``cfg_seq_parallel``,
default False), ``micro_batch`` (``cfg_micro_batch``; when the config does not set it, from the
log as ``global_batch / (gradient_accumulation_steps * dp)`` if that is whole),
``dp = derived_dp`` (= ``num_gpus / (tp*pp*cp)``), ``global_batch = global_batch_size`` (as
logged, sequences), ``num_gpus = n_accelerators``, ``gpus_per_node = accelerators_per_node``,
``dtype = fp8`` when ``cfg_fp8`` is true, else ``bf16`` (NeMo's default precision; the column
is only ever true or blank, so blank means "not set in the config file", which may miss FP8
set elsewhere), ``ep = 1``. A config that does not set ``vpp`` (NVIDIA's v3.1 GPT-3 configs)
takes the most common ``vpp`` of the configs in the same file that state it for the same
benchmark, ``tp``, ``pp`` and micro batch (every stated NVIDIA GPT-3 config interleaves;
plain 1F1B would nearly double a step of 8 microbatches), else 1. The framework is not a
column either: these submissions run NVIDIA's NeMo, whose LLM recipes train with Apex's
``distributed_fused_adam`` (optimizer state sharded over data-parallel ranks and the
gradient reduce-scatter overlapped with the last backward), so LLM rows get
``zero_stage = 1`` and ``overlap_grad_reduce = True`` (BERT rows: 0 and False).
``recompute`` is not recorded in the configs: it is set to ``"none"``, and
every value that came from a default, a framework setting or another row rather than the
row's own source is listed in the ``defaulted_fields`` column (``;``-separated, e.g.
``"recompute;zero_stage;overlap_grad_reduce;cp;vpp"``),
so a consumer can drop or down-weight rows whose layout is partly assumed.

BERT: ``micro_batch = cfg_local_batch_per_gpu_BATCHSIZE`` when present, else
``global_batch / dp`` if whole (listed in ``defaulted_fields``). NVIDIA's BERT packs about two
sequences into each 512-token row, so ``BATCHSIZE`` counts packed rows while the logged
``global_batch_size`` counts sequences: ``global_batch / (dp * micro_batch)`` is often 2 or a
fraction, not an accumulation count. ``tp = pp = cp = vpp = 1``. The BERT dtype is not
recorded: ``bf16`` is an assumption (listed in ``defaulted_fields``); NVIDIA's BERT may run
fp16, which has the same tensor-core peak on these GPUs.

``gpu`` is ``accelerator_model_name`` as printed ("NVIDIA H100-SXM5-80GB", "TPU-v5p" ...);
the catalog resolver decides which are known.

Rejected rows (reason column, several joined by ``"; "``): the run log is missing from the
snapshot, the row is a re-listed run (``duplicate_of`` set: ``"duplicate of <x>"``), the run
did not succeed (``run_status`` aborted or empty), the parallel fields are blank (config not
matched, or rejected because it disagreed with the log), dp is not a positive integer or
``tp*pp*cp*dp != num_gpus``, the micro batch is unknown, the global batch is missing, the
benchmark is unknown, or there is no measured time. Systems rows are rejected when every run
is a duplicate of another row, when no run succeeded, or when every log is missing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.records import ReadResult, RejectionReasons
from perfcast.data.tables import RUN_COLUMNS, read_table, require_columns

logger = logging.getLogger(__name__)

SOURCE_NAME = "mlperf"
"""Prefix of the ``source`` provenance column (followed by the repo and the result path)."""


@dataclass(frozen=True)
class BenchmarkModel:
    """Model shape and training mode of an MLPerf benchmark (see the module docstring)."""

    model: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    gated_mlp: bool
    tied_embeddings: bool
    finetune: str = "full"


BENCHMARK_MODELS: dict[str, BenchmarkModel] = {
    "gpt3": BenchmarkModel("gpt3-175b", "gpt", 96, 12288, 96, 96, 49152, 50257, 2048, False, True),
    "llama2_70b_lora": BenchmarkModel("llama2-70b", "llama", 80, 8192, 64, 8, 28672, 32000, 8192, True, False, "lora"),
    "llama31_405b": BenchmarkModel("llama3.1-405b", "llama", 126, 16384, 128, 8, 53248, 128256, 8192, True, False),
    "llama31_8b": BenchmarkModel("llama3.1-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 8192, True, False),
    "bert": BenchmarkModel("bert-large", "bert", 24, 1024, 16, 16, 4096, 30522, 512, False, True),
}
"""MLPerf benchmark name -> model shape; ``seq_len`` is the default when the log has none."""

DEFAULT_DTYPE = "bf16"
"""Training dtype when the config does not set FP8."""

PROVENANCE_RUNS: tuple[str, ...] = (
    "mlperf_version", "submitter", "system", "benchmark", "run_file", "config_match_method", "duplicate_of",
    "run_status",
)  # fmt: skip
PROVENANCE_SYSTEMS: tuple[str, ...] = (
    "mlperf_version", "submitter", "system", "benchmark", "config_match_method", "n_run_files", "n_runs_success",
    "n_logs_missing_in_snapshot",
)  # fmt: skip

_COMMON_REQUIRED = (
    "mlperf_version", "submitter", "system", "benchmark", "repo", "n_accelerators", "accelerators_per_node",
    "accelerator_model_name", "global_batch_size", "max_sequence_length", "config_match_method",
)  # fmt: skip
_LLM_REQUIRED = (
    *_COMMON_REQUIRED, "gradient_accumulation_steps", "lora_rank", "cfg_tp", "cfg_pp", "cfg_cp", "cfg_vpp_interleave",
    "cfg_seq_parallel", "cfg_micro_batch", "cfg_fp8", "derived_dp", "config_rejected",
)  # fmt: skip
_RUN_REQUIRED = ("run_file", "log_missing_in_snapshot", "duplicate_of", "run_status", "time_to_train_min")
_SYSTEM_REQUIRED = (
    "n_run_files", "n_logs_missing_in_snapshot", "n_runs_success", "ttt_min_median_success",
    "all_runs_duplicate_of_another_row",
)  # fmt: skip

LLM_RUNS_REQUIRED: tuple[str, ...] = (*_LLM_REQUIRED, *_RUN_REQUIRED, "step_time_s_median")
LLM_SYSTEMS_REQUIRED: tuple[str, ...] = (*_LLM_REQUIRED, *_SYSTEM_REQUIRED, "step_time_s_median_over_runs")
BERT_RUNS_REQUIRED: tuple[str, ...] = (*_COMMON_REQUIRED, *_RUN_REQUIRED, "cfg_local_batch_per_gpu_BATCHSIZE")
BERT_SYSTEMS_REQUIRED: tuple[str, ...] = (*_COMMON_REQUIRED, *_SYSTEM_REQUIRED, "cfg_local_batch_per_gpu_BATCHSIZE")
"""Columns each reader needs; a file missing any of them raises DatasetError."""

_TRUE = frozenset({"true", "1", "1.0", "yes"})
_FALSE = frozenset({"false", "0", "0.0", "no"})
_EXTRA_COLUMNS = ("gated_mlp", "tied_embeddings", "overlap_grad_reduce", "model", "architecture")
_MEASURED_COLUMNS = ("timing_scope", "measured_step_ms", "measured_ttt_min")


def read_mlperf_llm_runs(path: str | Path) -> ReadResult:
    """Read ``mlperf_training_llm_runs.csv`` into run records, one per accepted run.

    Returns:
        ``records``: the run-table columns, ``gated_mlp, tied_embeddings, model, architecture``,
        ``timing_scope``, ``measured_step_ms``, ``measured_ttt_min``, ``source``,
        ``defaulted_fields`` and the provenance columns :data:`PROVENANCE_RUNS`.
        ``rejected``: source rows as read, with a ``reason`` column.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    return _read(path, LLM_RUNS_REQUIRED, llm=True, runs=True)


def read_mlperf_llm_systems(path: str | Path) -> ReadResult:
    """Read ``mlperf_training_llm_systems.csv`` into run records, one per accepted system.

    Times: ``measured_step_ms = step_time_s_median_over_runs * 1000``, ``measured_ttt_min =
    ttt_min_median_success``. Provenance columns: :data:`PROVENANCE_SYSTEMS`. Otherwise as
    :func:`read_mlperf_llm_runs`.
    """
    return _read(path, LLM_SYSTEMS_REQUIRED, llm=True, runs=False)


def read_mlperf_bert_runs(path: str | Path) -> ReadResult:
    """Read ``mlperf_training_bert_runs.csv`` into BERT-large run records (``time_to_train``)."""
    return _read(path, BERT_RUNS_REQUIRED, llm=False, runs=True)


def read_mlperf_bert_systems(path: str | Path) -> ReadResult:
    """Read ``mlperf_training_bert_systems.csv`` into BERT-large run records (``time_to_train``)."""
    return _read(path, BERT_SYSTEMS_REQUIRED, llm=False, runs=False)


def _num(raw: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(raw[col], errors="coerce").astype("float64")


def _text(raw: pd.DataFrame, col: str) -> pd.Series:
    """Stripped strings, ``""`` for missing cells."""
    return raw[col].astype("string").str.strip().fillna("").astype(object)


def _flag(values: pd.Series) -> pd.Series:
    """True / False / <NA> (blank or unreadable) per cell."""
    text = values.astype("string").str.strip().str.lower()
    out = pd.Series(pd.NA, index=values.index, dtype="boolean")
    out[text.isin(_TRUE).fillna(False).to_numpy(dtype=bool)] = True
    out[text.isin(_FALSE).fillna(False).to_numpy(dtype=bool)] = False
    return out


def _whole(value: pd.Series) -> pd.Series:
    """Mask of positive finite whole numbers."""
    return (np.isfinite(value) & (value > 0) & (value == np.round(value))).fillna(False)


def _read(path: str | Path, required: tuple[str, ...], *, llm: bool, runs: bool) -> ReadResult:
    raw = read_table(path)
    require_columns(raw, required, path, "MLPerf")
    raw = raw.reset_index(drop=True)
    r = RejectionReasons(len(raw))
    _availability_checks(raw, r, runs=runs)
    fields, defaulted = _layout(raw, r, llm=llm)
    times = _times(raw, r, llm=llm, runs=runs)
    ok, rejected = r.split(raw, path)
    records = _records(raw[ok], fields[ok], defaulted[ok], times[ok], runs=runs)
    return ReadResult(records=records, rejected=rejected)


def _availability_checks(raw: pd.DataFrame, r: RejectionReasons, *, runs: bool) -> None:
    """Reject missing logs, re-listed runs and unsuccessful runs."""
    if runs:
        r.add(_flag(raw["log_missing_in_snapshot"]).fillna(False), "run log missing from the snapshot")
        dup = _text(raw, "duplicate_of")
        r.add(dup != "", dup.map(lambda v: f"duplicate of {v}"))
        status = _text(raw, "run_status")
        r.add(status.str.lower() != "success", status.map(lambda v: f"run_status={v or 'empty'!s} (not success)"))
        return
    n_files, n_missing, n_success = (
        _num(raw, c) for c in ("n_run_files", "n_logs_missing_in_snapshot", "n_runs_success")
    )
    r.add(_flag(raw["all_runs_duplicate_of_another_row"]).fillna(False), "all runs are duplicates of another row")
    r.add((n_files > 0) & (n_missing >= n_files), "every run log missing from the snapshot")
    r.add(~(n_success > 0), "no successful run")


def _layout(raw: pd.DataFrame, r: RejectionReasons, *, llm: bool) -> tuple[pd.DataFrame, pd.Series]:
    """Model and layout fields of every row (floats; rejected rows may hold NaN) and defaults used."""
    n = len(raw)
    defaulted = [[] for _ in range(n)]

    def note(mask: pd.Series | np.ndarray, field: str) -> None:
        for i in np.flatnonzero(np.asarray(mask, dtype=bool)):
            defaulted[i].append(field)

    bench = _text(raw, "benchmark")
    known = bench.isin(BENCHMARK_MODELS)
    r.add(~known, bench.map(lambda v: f"unknown benchmark {v!r} (known: {', '.join(BENCHMARK_MODELS)})"))
    num_gpus = _num(raw, "n_accelerators")
    r.add(~_whole(num_gpus), "n_accelerators is not a positive integer")
    gpn = _num(raw, "accelerators_per_node")
    r.add(~_whole(gpn), "accelerators_per_node is not a positive integer")
    gpu = _text(raw, "accelerator_model_name")
    r.add(gpu == "", "accelerator_model_name is missing")
    gbs = _num(raw, "global_batch_size")
    r.add(~_whole(gbs), "global_batch_size is missing or not a positive integer")

    out = pd.DataFrame(index=raw.index)
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size"):
        out[field] = bench.map(lambda b, f=field: getattr(BENCHMARK_MODELS[b], f) if b in BENCHMARK_MODELS else np.nan)
    seq = _num(raw, "max_sequence_length")
    default_seq = bench.map(lambda b: BENCHMARK_MODELS[b].seq_len if b in BENCHMARK_MODELS else np.nan)
    seq_given = _whole(seq)
    note(known & ~seq_given, "seq_len")
    out["seq_len"] = seq.where(seq_given, default_seq.astype(float))
    out["finetune"] = bench.map(lambda b: BENCHMARK_MODELS[b].finetune if b in BENCHMARK_MODELS else "full")
    out["num_gpus"], out["gpus_per_node"], out["global_batch"], out["gpu"] = num_gpus, gpn, gbs, gpu
    out["ep"], out["zero_stage"], out["recompute"] = 1, 0, "none"
    note(np.ones(n, dtype=bool), "recompute")
    out["overlap_grad_reduce"] = False
    if llm:  # NeMo's distributed_fused_adam (module docstring)
        out["zero_stage"], out["overlap_grad_reduce"] = 1, True
        note(np.ones(n, dtype=bool), "zero_stage")
        note(np.ones(n, dtype=bool), "overlap_grad_reduce")

    if llm:
        _llm_layout(raw, r, out, note)
    else:
        _bert_layout(raw, out, note)
    return out, pd.Series([";".join(d) for d in defaulted], index=raw.index, dtype=object)


def _llm_layout(raw: pd.DataFrame, r: RejectionReasons, out: pd.DataFrame, note) -> None:  # noqa: ANN001
    tp, pp, cp, vpp = (_num(raw, c) for c in ("cfg_tp", "cfg_pp", "cfg_cp", "cfg_vpp_interleave"))
    rejected_cfg = _flag(raw["config_rejected"]).fillna(False).to_numpy(dtype=bool)
    blank = (tp.isna() | pp.isna()).to_numpy()
    method = _text(raw, "config_match_method")
    r.add(
        blank & ~rejected_cfg,
        method.map(lambda m: f"parallel layout unknown: config not matched ({m or 'no config found'})"),
    )
    r.add(rejected_cfg, "parallel layout unknown: config rejected (disagreed with the log)")
    has = ~blank & ~rejected_cfg
    r.add(has & ~(_whole(tp) & _whole(pp)), "cfg_tp/cfg_pp are not positive integers")
    note(cp.isna(), "cp")
    note(vpp.isna(), "vpp")
    stated_vpp = vpp
    cp, vpp = cp.fillna(1.0), vpp.fillna(1.0)
    r.add(has & ~(_whole(cp) & _whole(vpp)), "cfg_cp/cfg_vpp_interleave are not positive integers")
    dp = _num(raw, "derived_dp")
    r.add(has & ~_whole(dp), dp.map(lambda v: f"dp={v} is not a positive integer"))
    product = tp * pp * cp * dp
    r.add(has & _whole(dp) & (product != out["num_gpus"]), "tp*pp*cp*dp != n_accelerators")
    mbs = _num(raw, "cfg_micro_batch")
    gas = _num(raw, "gradient_accumulation_steps")
    from_log = out["global_batch"] / (gas * dp)
    use_log = ~_whole(mbs) & _whole(from_log)
    note(use_log, "micro_batch")
    mbs = mbs.where(~use_log, from_log)
    r.add(has & ~_whole(mbs), "micro batch unknown: cfg_micro_batch blank and not derivable from the log")
    seq_par = _flag(raw["cfg_seq_parallel"])
    note(seq_par.isna(), "sequence_parallel")
    fp8 = _flag(raw["cfg_fp8"])
    note(fp8.isna(), "dtype")
    lora = out["finetune"] == "lora"
    rank = _num(raw, "lora_rank")
    r.add(lora & ~_whole(rank), "lora_rank missing from the log")
    vpp = vpp.where(~(stated_vpp.isna() & has & (pp > 1)), _vpp_from_stated_configs(raw, tp, pp, mbs, stated_vpp, has))
    out["tp"], out["pp"], out["cp"], out["vpp"], out["dp"], out["micro_batch"] = tp, pp, cp, vpp, dp, mbs
    out["sequence_parallel"] = seq_par.fillna(False).astype(bool)
    out["dtype"] = np.where(fp8.fillna(False).to_numpy(dtype=bool), "fp8", DEFAULT_DTYPE)
    out["lora_rank"] = rank.where(lora, 0.0)


def _vpp_from_stated_configs(
    raw: pd.DataFrame, tp: pd.Series, pp: pd.Series, mbs: pd.Series, stated: pd.Series, has: np.ndarray
) -> pd.Series:
    """Per row, the most common stated ``vpp`` of the file's configs with the same benchmark, tp, pp and
    micro batch (1 where none states one); only layout fields are read, never measured times."""
    key = _text(raw, "benchmark") + "|" + tp.astype(str) + "|" + pp.astype(str) + "|" + mbs.astype(str)
    known = stated.notna() & has
    evidence = stated[known].groupby(key[known]).agg(lambda v: v.mode().iloc[0])
    return key.map(evidence).fillna(1.0).astype(float)


def _bert_layout(raw: pd.DataFrame, out: pd.DataFrame, note) -> None:  # noqa: ANN001
    dp = out["num_gpus"]
    mbs = _num(raw, "cfg_local_batch_per_gpu_BATCHSIZE")
    from_log = out["global_batch"] / dp
    use_log = ~_whole(mbs) & _whole(from_log)
    note(use_log, "micro_batch")
    note(np.ones(len(raw), dtype=bool), "dtype")
    out["tp"] = out["pp"] = out["cp"] = out["vpp"] = 1
    out["dp"] = dp
    out["micro_batch"] = mbs.where(~use_log, from_log)
    out["sequence_parallel"] = False
    out["dtype"] = DEFAULT_DTYPE
    out["lora_rank"] = 0


def _times(raw: pd.DataFrame, r: RejectionReasons, *, llm: bool, runs: bool) -> pd.DataFrame:
    """``timing_scope``, ``measured_step_ms`` and ``measured_ttt_min`` of every row."""
    ttt = _num(raw, "time_to_train_min" if runs else "ttt_min_median_success")
    if llm:
        step_s = _num(raw, "step_time_s_median" if runs else "step_time_s_median_over_runs")
    else:
        step_s = pd.Series(np.nan, index=raw.index)
    step_ms = (step_s * 1000.0).where(step_s > 0)
    ttt = ttt.where(ttt > 0)
    r.add(step_ms.isna() & ttt.isna(), "no measured time: step time and time to train are missing or not positive")
    scope = np.where(step_ms.notna(), "step", "time_to_train")
    return pd.DataFrame({"timing_scope": scope, "measured_step_ms": step_ms, "measured_ttt_min": ttt}, index=raw.index)


def _records(
    raw: pd.DataFrame, fields: pd.DataFrame, defaulted: pd.Series, times: pd.DataFrame, *, runs: bool
) -> pd.DataFrame:
    """Assemble the accepted rows in the run-table column order."""
    out = fields.copy()
    int_cols = [c for c in RUN_COLUMNS if c not in ("sequence_parallel", "recompute", "finetune", "dtype", "gpu")]
    for col in int_cols:
        out[col] = pd.to_numeric(out[col], errors="coerce").round().astype("Int64")
    bench = raw["benchmark"].astype(str).str.strip()
    out["gated_mlp"] = bench.map(lambda b: BENCHMARK_MODELS[b].gated_mlp).astype(bool)
    out["tied_embeddings"] = bench.map(lambda b: BENCHMARK_MODELS[b].tied_embeddings).astype(bool)
    out["model"] = bench.map(lambda b: BENCHMARK_MODELS[b].model)
    out["architecture"] = bench.map(lambda b: BENCHMARK_MODELS[b].architecture)
    out = out.join(times)
    repo = raw["repo"].astype(str)
    if runs:
        where = raw["run_file"].astype(str)
        provenance = PROVENANCE_RUNS
    else:
        where = raw["submitter"].astype(str) + "/results/" + raw["system"].astype(str) + "/" + bench
        provenance = PROVENANCE_SYSTEMS
    out["source"] = SOURCE_NAME + ":" + repo + ":" + where
    out["defaulted_fields"] = defaulted
    for col in provenance:
        out[col] = raw[col]
    ordered = [*RUN_COLUMNS, *_EXTRA_COLUMNS, *_MEASURED_COLUMNS, "source", "defaulted_fields", *provenance]
    return out[ordered].reset_index(drop=True)
