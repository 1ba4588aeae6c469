"""Reader of published step times of current LLM training stacks as run records.

Source: ``published_llm_training_steps.csv`` (``../shared/data``; README section
"published_llm_training_steps.csv"): one row per configuration that a framework's
authors measured and published (MosaicML llm-foundry, PyTorch torchtitan, NeMo 24.07 and
its long-sequence table, NeMo AutoModel, MaxText). The file already carries run-table
columns; this reader keeps them as given and adds what the run records need.

Mapping, one record per source row:

* Run-table columns (``num_layers`` .. ``gpus_per_node``), ``num_experts``, ``top_k``
  and ``notes``: as given, except :data:`PRESET_STATED_COLUMNS` on a row that names a preset
  and ``ep`` on some MoE rows (both below). Empty cells stay empty (NaN): nothing unstated is
  invented. The one exception is a field the run records require
  (:data:`~perfcast.data.schema.RUN_RECORD_REQUIRED`) that the row leaves empty while its
  ``model`` names a perfcast preset: the preset's value fills it (:data:`PRESET_FILLS`,
  written out here because the data layer does not read the features catalogs; a test
  checks it against the presets) and the field is named in ``defaulted_fields``
  (``;``-separated). Other empty required fields stay empty and the record checks
  reject those rows. A torchtitan row with pipeline parallelism (``pp > 1``, ``vpp`` 1) and
  no ``micro_batch`` gets torchtitan's default: a rank's local batch (``global_batch / dp``)
  is split into as many microbatches as there are pipeline stages, ``micro_batch =
  global_batch / (dp * pp)`` (:func:`_pipeline_microbatch_fills`), also named in
  ``defaulted_fields``.
* ``model_name``: the file's ``model`` text, always. ``model``: the same name when it is a
  perfcast preset (:data:`PRESET_MODELS`) or the row does not spell its shape
  (:data:`SHAPE_FIELDS`); empty for a name that is not a preset (``mpt-7b``,
  ``nemotron4-340b`` ...) on a row that gives the shape, because a run table's ``model``
  must name a preset and the shape columns already describe the model. A row naming a
  preset leaves :data:`PRESET_STATED_COLUMNS` to it (empty here): the preset states the
  architecture (dense and expert FFN widths, latent attention, head size, windowed layers)
  that the file's flat columns cannot.
* ``finetune``: as given (``sft`` = full-parameter supervised fine-tuning, ``lora``);
  empty for pre-training rows.
* ``document_tokens``: the attention length of a fine-tuning dataset packed with
  per-document attention masks, for rows whose ``notes`` name a dataset of
  :data:`PACKED_DOCUMENT_TOKENS` (NeMo 24.07's SQuAD runs, "packed to 4096 tokens"); named in
  ``defaulted_fields``, since no row states it. Empty elsewhere (attention over the whole
  sequence).
* ``ep``: as given, except on MoE rows whose ``notes`` list expert-parallel kernels
  (:data:`EXPERT_PARALLEL_KERNELS`) with ``ep`` 1, read as the largest size dividing both
  ``dp * cp`` and ``num_experts`` and named in ``defaulted_fields`` (:func:`_expert_parallel_fills`).
* torchtitan rows (:func:`_torchtitan_fills`): ``recompute`` ``selective`` is torchtitan's
  selective activation checkpointing, read as ``op-sac`` (its default op-level policy,
  :data:`TORCHTITAN_OP_SAC`; named in ``defaulted_fields`` where the notes do not say the
  op-level policy); ``torch_compile`` as the row's ``notes`` state it
  (:data:`TORCHTITAN_COMPILE_NOTES`), else empty (the framework's default, as is
  ``sequence_parallel``, which torchtitan's tensor parallelism always runs); ``fp8_recipe`` of fp8
  rows as the notes name it (:data:`TORCHTITAN_FP8_RECIPES`).
* ``timing_scope = "step"``: one optimizer step over ``global_batch`` sequences.
* ``measured_step_ms``: as given (ms). Where it is empty but ``measured_tokens_per_s_per_gpu``
  is given it is derived as ``global_batch * seq_len / (tokens_per_s_per_gpu * num_gpus) *
  1000``. ``step_ms_basis`` says where the time comes from: ``printed`` (the source prints
  a step time), ``tokens_per_s`` (the file derived it from tokens/s; its ``notes`` say
  "step_ms derived"), ``tokens_per_s_by_reader`` (derived here), empty when the source gives
  neither (MaxText: TFLOP/s only; the record checks reject such rows for lack of a time).
* ``measured_tokens_per_s_per_gpu``, ``measured_tflops_per_gpu``, ``measured_mfu``
  (fraction): as given; each source counts FLOPs its own way.
* ``source``: a short stable id per publishing table (:data:`SOURCE_TABLES`, e.g.
  ``published:torchtitan``), ``published:<slug of the text>`` for a table not listed there;
  ``source_text`` keeps the file's ``source`` text, with ``source_commit``, ``source_path``
  and ``source_row`` (0-based data row of the file).
* ``framework``: from the publishing table (:data:`SOURCE_TABLES`): ``megatron-core`` for
  NeMo's tables, ``torchtitan``, ``pytorch-fsdp`` for llm-foundry (Composer over PyTorch
  FSDP) and NeMo AutoModel (its PyTorch-native FSDP2 backend), ``maxtext`` (JAX); empty
  for an unlisted table.
* ``gpu``: the file's spelling (e.g. ``"H100 SXM 80GB (DGX-H100)"``), resolved to a catalog
  id by the record checks' ``resolve_gpu`` hook; ``device_name`` keeps the spelling. A board
  the hardware catalog lacks but :data:`GPU_STAND_INS` lists is read as its stand-in part,
  and ``gpu`` is named in ``defaulted_fields``.

Rejected rows (``reason`` column): a numeric cell that is not a number (``tp='x'``), a
whole-number cell with a fraction, or an empty ``source``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.records import ReadResult, RejectionReasons, name_defaulted
from perfcast.data.schema import RUN_INT_COLUMNS, RUN_RECORD_REQUIRED, Fp8Recipe, TimingScope
from perfcast.data.tables import RUN_COLUMNS, RUN_MEASURED_COLUMN, read_table
from perfcast.errors import DatasetError

logger = logging.getLogger(__name__)

SOURCE_PREFIX = "published"
"""Prefix of the ``source`` ids this reader writes."""

SOURCE_TABLES: tuple[tuple[str, str, str], ...] = (
    ("NeMo AutoModel", "published:nemo-automodel", "pytorch-fsdp"),
    ("NeMo performance summary, long input sequences", "published:nemo-24.03-long-seq", "megatron-core"),
    ("NeMo performance summary (NeMo 24.07", "published:nemo-24.07", "megatron-core"),
    ("llm-foundry", "published:llm-foundry", "pytorch-fsdp"),
    ("torchtitan", "published:torchtitan", "torchtitan"),
    ("MaxText", "published:maxtext", "maxtext"),
)
"""(text the file's ``source`` contains, source id, framework), the first match wins."""

PRESET_FILLS: dict[str, dict[str, int]] = {
    "gpt3-175b": {"vocab_size": 50257},
}
"""Preset values for required fields some rows leave empty: ``model`` -> {field: value}.
Only presets of perfcast's model catalog appear here (a test compares them)."""

PRESET_MODELS: frozenset[str] = frozenset({
    "gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt3-175b",
    "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-8b", "llama3.1-70b",
    "llama3.1-405b", "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-72b",
    "deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b",
})  # fmt: skip
"""Model names kept in ``model``: the presets of perfcast's model catalog (a test checks they are
the same set; written out because the data layer does not read the features catalogs)."""

PRESET_STATED_COLUMNS: tuple[str, ...] = ("num_kv_heads", "ffn_hidden_size", "num_experts", "top_k")
"""Shape columns left empty on a row that names a preset: the preset states them.

The file flattens an architecture into one FFN width and one head count, and says in ``notes``
what its cells then mean: the routed experts' FFN (DeepSeek-V3 and Kimi-K2, whose first
layers are dense and 18432 wide; Qwen3-MoE), the attention heads of multi-head latent attention
as ``num_kv_heads``. Copied into a run table, whose ``ffn_hidden_size`` is the dense FFN and
whose fields override a preset's, they would replace what the preset states correctly. The
required shape columns (layers, width, heads, vocabulary) stay; a test checks that every
row's values agree with its preset's."""
GPU_STAND_INS: dict[str, str] = {
    "H100 SXM 96GB HBM2e (500W, Grand Teton)": "h100-sxm5-80gb",
    "H100 SXM 95GB HBM2e (lower TDP)": "h100-sxm5-80gb",
}
"""The file's spelling of a board the hardware catalog lacks -> the catalog part its runs are read on.

torchtitan measured on H100 SXM boards of Meta's Grand Teton servers with HBM2e memory and a
power limit below the 700 W part's; no datasheet states their memory bandwidth or clocks, so
``../shared/hardware`` has no row for them. Their runs are read on the figures of the H100 SXM
part the catalog has (same GH100 SXM module, HBM3, 700 W) rather than dropped; the lower power
limit and bandwidth are not modelled, so these runs may measure slower than the stand-in
predicts. ``gpu`` is named in ``defaulted_fields``; ``device_name`` keeps the file's spelling."""

EXPERT_PARALLEL_KERNELS = "DeepEP"
"""Text of a row's ``notes`` naming the expert-parallel all-to-all kernels a run used.

NeMo AutoModel's table lists DeepEP among the kernels of its gpt-oss runs but leaves their EP
column empty ("-"), which the file reads as ``ep`` 1. Without expert parallelism FSDP2 would
gather all of gpt-oss-120b's 117B bf16 weights across its 64 GPUs for every microbatch's forward
and backward: each gather moves about 200 GB per GPU over 50 GB/s links, 4 s, and the step
(four microbatches) measured 4.3 s in all. Those rows are read with ``ep`` the largest size that
divides both ``dp * cp`` and ``num_experts`` (``dp`` for both gpt-oss rows, 8 and 64 GPUs), which
is what the table states for its other DeepEP runs of up to 64 data-parallel ranks
(Nemotron-3-Nano and Qwen3-30B-A3B: 8, Kimi-K2: 32, Nemotron-3-Super and DeepSeek-V3: 64); ``ep``
is named in ``defaulted_fields``. The rows' ``notes`` still say "EP '-' in source (not used) ->
ep=1": they are the file's reading, kept as given. For gpt-oss-20b (8 GPUs, 42 GB of weights
gathered over NVLink) the argument is weaker; it is read by the same rule."""

PACKED_DOCUMENT_TOKENS: dict[str, int] = {"SQuAD-v1.1 packed": 128}
"""Text of a row's ``notes`` naming a packed fine-tuning dataset -> its attention length,
tokens (``document_tokens``).

NeMo 24.07 fine-tunes on SQuAD v1.1 with several question-answer documents packed into
each 4096-token sequence and attention kept within each document. No row states the
documents' length; the table's own FLOP counts bound it. Its stated TFLOP/s per GPU divided by
its tokens/s per GPU is NeMo's model FLOPs per token, which for the pre-training rows matches
Megatron's count (:meth:`~perfcast.features.model_counts.ModelCounts.flops_per_token`) at the
row's ``seq_len`` to 0.1% (the attention length it implies lies within 1% of ``seq_len``); for
the SFT rows it implies attention over 128, 93 and 21 tokens (7B, 13B, 70B), so NeMo counted
documents of about a hundred tokens. The largest of these is used (a test recomputes them);
a step barely changes between 128 and 512 tokens, where attention is a few percent of it."""

TORCHTITAN_OP_SAC = re.compile(r"\bop AC|per-op SAC|selective\(op\)", re.IGNORECASE)
"""``notes`` text saying that a torchtitan row's selective checkpointing is op-level.

torchtitan's ``activation_checkpoint.mode = "selective"`` runs its op-level policy by default
(``selective_ac_option = "op"``): each block keeps the outputs of every other matmul, of the
attention kernel and of tensor-parallel reduce-scatters, and replays the rest (``op-sac``). Its
other option checkpoints every other block whole (``selective_ac_option = "2"``, "selective
layer AC" in the file), which replays about as much: half the GEMMs, and the attention and
vector ops of half the layers. The file's A100 table measured both on the same runs, 2%
apart. Every torchtitan ``selective`` row is read as ``op-sac``; where ``notes`` do not match
this pattern, ``recompute`` is named in ``defaulted_fields``."""

TORCHTITAN_COMPILE_NOTES: tuple[tuple[re.Pattern[str], bool], ...] = (
    (re.compile(r"torch\.compile"), True),
    (re.compile(r"\beager\b"), False),
)
"""(pattern, ``torch_compile``) pairs read from a torchtitan row's ``notes``, the first match
wins; its tables compare eager runs with ``torch.compile``. Rows that say neither leave the
switch to the framework's default.

Asynchronous tensor parallelism ("async TP" in the notes) is not read into ``tp_comm_overlap``:
torchtitan's runs gain less from it than the composed step, which hides each overlapped
collective whole, and reading it made the held-out torchtitan source worse (``docs/readers.md``;
``benchmarks/results/step_transfer_eval.async-tp.md``)."""

TORCHTITAN_FP8_RECIPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"float8 \(?tensorwise", re.IGNORECASE), Fp8Recipe.TENSORWISE.value),
    (re.compile(r"float8 \(?rowwise", re.IGNORECASE), Fp8Recipe.ROWWISE.value),
)
"""(pattern, ``fp8_recipe``) pairs read from a torchtitan fp8 row's ``notes`` ("quantization float8
rowwise", "Float8 (tensorwise, ...)"); rows that say neither leave the recipe to the dtype's default.
The composed step times every recipe alike (docs/precisions.md says what that misses)."""

SHAPE_FIELDS: tuple[str, ...] = ("num_layers", "hidden_size", "num_heads", "vocab_size")
"""Shape columns a row must give for a non-preset ``model`` name to move to ``model_name``."""

STEP_MS_BASES = ("printed", "tokens_per_s", "tokens_per_s_by_reader")
"""Values of the ``step_ms_basis`` column (see the module docstring)."""

_TEXT_COLUMNS = (
    "source", "source_commit", "source_path", "model", "recompute", "finetune", "dtype", "gpu", "notes",
)  # fmt: skip
_FLOAT_COLUMNS = (
    "measured_step_ms", "measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu", "measured_mfu",
)  # fmt: skip
_NUMBER_COLUMNS = tuple(c for c in (*RUN_COLUMNS, "num_experts", "top_k") if c in RUN_INT_COLUMNS)
_BOOL_COLUMNS = ("sequence_parallel",)

REQUIRED_COLUMNS: tuple[str, ...] = (*_TEXT_COLUMNS, *_NUMBER_COLUMNS, *_BOOL_COLUMNS, *_FLOAT_COLUMNS)
"""Columns of the file the reader needs; a file missing any of them raises DatasetError."""

_DERIVED_NOTE = "step_ms derived"
_OUTPUT_EXTRA = (
    "num_experts", "top_k", "model", "model_name", "framework", "timing_scope", RUN_MEASURED_COLUMN, "step_ms_basis",
    "measured_tokens_per_s_per_gpu", "measured_tflops_per_gpu", "measured_mfu", "source", "source_text",
    "source_commit", "source_path", "source_row", "device_name", "notes", "document_tokens", "torch_compile",
    "fp8_recipe", "defaulted_fields",
)  # fmt: skip


def read_published_steps(path: str | Path) -> ReadResult:
    """Read ``published_llm_training_steps.csv`` into run records, one per source row.

    Args:
        path: the file (or a CSV/Parquet table with its columns).

    Returns:
        ``records``: the run-table columns (:data:`~perfcast.data.tables.RUN_COLUMNS`), then
        ``num_experts, top_k, model, model_name, framework, timing_scope, measured_step_ms, step_ms_basis,
        measured_tokens_per_s_per_gpu, measured_tflops_per_gpu, measured_mfu, source,
        source_text, source_commit, source_path, source_row, device_name, notes, document_tokens,
        torch_compile, fp8_recipe, defaulted_fields`` (see the module docstring). Empty cells stay NaN.
        ``rejected``: source rows with an unreadable number or no source, as read, with
        ``source_row`` and a ``reason`` naming the field and value.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in raw.columns]
    if missing:
        raise DatasetError(f"{path}: missing required columns of the published-steps table: {', '.join(missing)}")
    raw = raw.reset_index(drop=True)
    raw.insert(0, "source_row", np.arange(len(raw), dtype=np.int64))
    reasons = RejectionReasons(len(raw))
    numbers = _numbers(raw, reasons)
    text = {c: raw[c].astype("string").str.strip().replace("", pd.NA) for c in _TEXT_COLUMNS}
    reasons.add(text["source"].isna().to_numpy(dtype=bool), "source is empty")
    ok, rejected = reasons.split(raw, path)
    records = _records(raw[ok], numbers[ok], {c: v[ok] for c, v in text.items()})
    return ReadResult(records=records, rejected=rejected)


def source_table(text: str) -> tuple[str, str | None]:
    """(source id, framework or None) of a publishing table named by the file's ``source`` text.

    A text that no :data:`SOURCE_TABLES` entry matches gets ``published:<slug>`` (lowercase,
    runs of other characters as ``-``) and no framework.
    """
    for needle, source_id, framework in SOURCE_TABLES:
        if needle.lower() in text.lower():
            return source_id, framework
    slug = re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")
    return f"{SOURCE_PREFIX}:{slug}", None


def _numbers(raw: pd.DataFrame, reasons: RejectionReasons) -> pd.DataFrame:
    """Numeric columns as float64 (empty cells NaN), rejecting text and fractional counts."""
    out = pd.DataFrame(index=raw.index)
    for col in (*_NUMBER_COLUMNS, *_FLOAT_COLUMNS):
        cells = raw[col]
        value = pd.to_numeric(cells, errors="coerce").astype("float64")
        given = cells.notna() & (cells.astype("string").str.strip() != "")
        bad = (given & value.isna()).to_numpy(dtype=bool)
        reasons.add(bad, cells.map(lambda v, c=col: f"{c}={v!r} is not a number"))
        if col in _NUMBER_COLUMNS:
            fraction = (np.isfinite(value) & (value != np.round(value))).to_numpy(dtype=bool)
            reasons.add(fraction, value.map(lambda v, c=col: f"{c}={v!r} is not a whole number"))
        out[col] = value
    flag = raw["sequence_parallel"].astype("string").str.strip().str.lower()
    truth = flag.map({"true": True, "1": True, "1.0": True, "false": False, "0": False, "0.0": False})
    bad = (flag.notna() & (flag != "") & truth.isna()).to_numpy(dtype=bool)
    reasons.add(bad, raw["sequence_parallel"].map(lambda v: f"sequence_parallel={v!r} is not true/false"))
    out["sequence_parallel"] = truth.astype("boolean")
    return out


def _step_times(num: pd.DataFrame, notes: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(``measured_step_ms``, ``step_ms_basis``) per row (see the module docstring)."""
    given = num[RUN_MEASURED_COLUMN]
    tps = num["measured_tokens_per_s_per_gpu"]
    derived = num["global_batch"] * num["seq_len"] / (tps * num["num_gpus"]) * 1000.0
    derivable = given.isna() & np.isfinite(derived) & (derived > 0)
    step = given.where(~derivable, derived)
    said_derived = notes.fillna("").str.contains(_DERIVED_NOTE, regex=False).to_numpy(dtype=bool)
    printed, by_file, by_reader = STEP_MS_BASES
    has = given.notna().to_numpy()
    basis = np.select([has & said_derived, has, derivable.to_numpy()], [by_file, printed, by_reader], default=None)
    return step, pd.Series(basis, index=num.index, dtype=object)


def _preset_fills(out: pd.DataFrame, model: pd.Series) -> pd.Series:
    """Fill required fields a row leaves empty from :data:`PRESET_FILLS`; the fields filled, per row."""
    filled = pd.Series("", index=out.index, dtype=object)
    for field in RUN_RECORD_REQUIRED:
        if field not in out:
            continue
        value = model.map(lambda m, f=field: PRESET_FILLS.get(m, {}).get(f) if isinstance(m, str) else None)
        use = out[field].isna() & value.notna()
        if use.any():
            out.loc[use, field] = value[use].astype(float)
            filled = name_defaulted(filled, use.to_numpy(dtype=bool), field)
    return filled


def _pipeline_microbatch_fills(out: pd.DataFrame, framework: pd.Series) -> np.ndarray:
    """Fill ``micro_batch`` of torchtitan rows with pipeline stages (module docstring); True where filled.

    torchtitan's ``pipeline_parallel_microbatches`` defaulted to the number of pipeline stages at
    the late-2024 commits these rows cite; with one stage per rank (``vpp`` 1) that is ``pp``.
    Rows whose local batch does not split evenly, or with interleaved stages, stay empty.
    """
    num = {c: out[c].to_numpy(dtype=float, na_value=np.nan) for c in ("global_batch", "dp", "pp", "vpp", "micro_batch")}
    with np.errstate(invalid="ignore", divide="ignore"):
        local = num["global_batch"] / (num["dp"] * num["pp"])
        fill = (
            framework.eq("torchtitan").fillna(False).to_numpy(dtype=bool)
            & np.isnan(num["micro_batch"])
            & (num["pp"] > 1)
            & (num["vpp"] == 1)
            & np.isfinite(local)
            & (local == np.round(local))
            & (local >= 1)
        )
    out.loc[fill, "micro_batch"] = local[fill]
    return fill


def _expert_parallel_fills(out: pd.DataFrame, notes: pd.Series) -> np.ndarray:
    """Set ``ep`` of MoE rows that run :data:`EXPERT_PARALLEL_KERNELS` with ``ep`` 1 (module
    docstring) to the largest size that divides both ``dp * cp`` (the ranks experts spread over)
    and ``num_experts``; True where set. Rows that leave ``num_experts`` empty stay as given."""
    num = {c: out[c].to_numpy(dtype=float, na_value=np.nan) for c in ("ep", "dp", "cp", "num_experts")}
    ranks = num["dp"] * np.where(np.isnan(num["cp"]), 1.0, num["cp"])
    known = np.isfinite(ranks) & np.isfinite(num["num_experts"])
    ep = np.ones(len(out))
    ep[known] = np.gcd(ranks[known].astype(np.int64), num["num_experts"][known].astype(np.int64))
    fill = (
        notes.fillna("").str.contains(EXPERT_PARALLEL_KERNELS, regex=False).to_numpy(dtype=bool)
        & (num["ep"] == 1)
        & (ep > 1)
    )
    out.loc[fill, "ep"] = ep[fill]
    return fill


def _torchtitan_fills(out: pd.DataFrame, notes: pd.Series, framework: pd.Series) -> np.ndarray:
    """Read torchtitan rows' recomputation and ``torch_compile`` (module docstring); True on the
    rows whose ``recompute`` is the reader's reading rather than the notes'."""
    titan = framework.eq("torchtitan").fillna(False).to_numpy(dtype=bool)
    text = notes.fillna("").astype(str)
    selective = titan & out["recompute"].eq("selective").fillna(False).to_numpy(dtype=bool)
    out.loc[selective, "recompute"] = "op-sac"
    compiled = pd.Series(pd.NA, index=out.index, dtype="boolean")
    for pattern, value in reversed(TORCHTITAN_COMPILE_NOTES):  # the first pattern wins
        compiled[titan & text.str.contains(pattern).to_numpy(dtype=bool)] = value
    out["torch_compile"] = compiled
    recipe = pd.Series(pd.NA, index=out.index, dtype=object)
    fp8 = titan & out["dtype"].eq("fp8").fillna(False).to_numpy(dtype=bool)
    for pattern, value in TORCHTITAN_FP8_RECIPES:
        recipe[fp8 & text.str.contains(pattern).to_numpy(dtype=bool)] = value
    out["fp8_recipe"] = recipe
    return selective & ~text.str.contains(TORCHTITAN_OP_SAC).to_numpy(dtype=bool)


def _packed_document_fills(out: pd.DataFrame, notes: pd.Series) -> np.ndarray:
    """Set ``document_tokens`` of rows whose notes name a :data:`PACKED_DOCUMENT_TOKENS` dataset;
    True where set."""
    tokens = pd.Series(pd.NA, index=out.index, dtype="Int64")
    for phrase, length in PACKED_DOCUMENT_TOKENS.items():
        tokens[notes.fillna("").str.contains(phrase, regex=False)] = length
    out["document_tokens"] = tokens
    return tokens.notna().to_numpy(dtype=bool)


def _records(raw: pd.DataFrame, num: pd.DataFrame, text: dict[str, pd.Series]) -> pd.DataFrame:
    """The accepted rows as run records, in column order (see :func:`read_published_steps`)."""
    out = num[[c for c in num.columns if c in (*_NUMBER_COLUMNS, "sequence_parallel")]].copy()
    tables = text["source"].map(lambda s: source_table(str(s)))
    for col in ("recompute", "finetune", "dtype", "gpu", "model", "notes"):
        out[col] = text[col].astype(object).where(text[col].notna(), None)
    defaulted = _preset_fills(out, text["model"])
    frameworks = tables.map(lambda t: t[1])
    defaulted = name_defaulted(defaulted, _pipeline_microbatch_fills(out, frameworks), "micro_batch")
    defaulted = name_defaulted(defaulted, _packed_document_fills(out, text["notes"]), "document_tokens")
    defaulted = name_defaulted(defaulted, _expert_parallel_fills(out, text["notes"]), "ep")
    defaulted = name_defaulted(defaulted, _torchtitan_fills(out, text["notes"], frameworks), "recompute")
    out["model_name"] = out["model"]
    # after the fills: the expert-parallel fill reads the file's num_experts
    out.loc[out["model"].isin(PRESET_MODELS), list(PRESET_STATED_COLUMNS)] = np.nan
    spelled = out[list(SHAPE_FIELDS)].notna().all(axis=1)
    unknown = out["model"].notna() & ~out["model"].isin(PRESET_MODELS)
    out.loc[spelled & unknown, "model"] = None
    for col in _NUMBER_COLUMNS:
        out[col] = out[col].round().astype("Int64")
    out["framework"] = frameworks.astype(object)
    out["timing_scope"] = TimingScope.STEP.value
    out[RUN_MEASURED_COLUMN], out["step_ms_basis"] = _step_times(num, text["notes"])
    for col in _FLOAT_COLUMNS[1:]:
        out[col] = num[col]
    out["source"] = tables.map(lambda t: t[0]).astype(object)
    out["source_text"] = text["source"].astype(object)
    out["source_commit"] = text["source_commit"].astype(object)
    out["source_path"] = text["source_path"].astype(object)
    out["source_row"] = raw["source_row"].astype("int64")
    out["device_name"] = out["gpu"]
    stand_in = out["gpu"].map(GPU_STAND_INS)
    out["gpu"] = stand_in.where(stand_in.notna(), out["gpu"])
    out["defaulted_fields"] = name_defaulted(defaulted, stand_in.notna().to_numpy(), "gpu")
    unknown = sorted(set(text["source"][out["framework"].isna()].astype(str)))
    if unknown:
        logger.info("published steps: no framework known for source(s) %s", "; ".join(unknown))
    return out[[*RUN_COLUMNS, *_OUTPUT_EXTRA]].reset_index(drop=True)
