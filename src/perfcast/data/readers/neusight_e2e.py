"""Reader of NeuSight's whole-model latencies (HF models, one GPU or one 4-GPU node) as run records.

See :mod:`perfcast.data.readers.neusight` for the source and its time statistic.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perfcast.data.readers._neusight_common import (
    SOURCE_NAME,
    bad_positive_int,
    bad_time,
    checked_dtypes,
    label_to_device,
    numeric_columns,
    read_source,
)
from perfcast.data.records import ReadResult, RejectionReasons
from perfcast.data.tables import RUN_COLUMNS, RUN_MEASURED_COLUMN

E2E_REQUIRED: tuple[str, ...] = (
    "gpu", "n_gpus", "model", "mode", "seq_len", "global_batch", "dp", "tp", "pp", "pp_num_microbatches",
    "fused_kernels", "dtype", "e2e_latency_ms", "model_arch", "cfg_n_layers", "cfg_hidden", "cfg_heads", "cfg_ffn",
    "cfg_vocab", "cfg_num_experts", "source_path",
)  # fmt: skip
"""Source columns :func:`read_neusight_e2e` needs; a file missing any of them raises DatasetError."""

E2E_DTYPE = "fp32"
"""NeuSight ran every model in fp32 (``mixed_precision=no`` for the 4-GPU runs)."""

_TIMING_SCOPES = {"inf": "fwd", "train": "fwd_bwd"}
_E2E_INT_COLUMNS = (
    "n_gpus",
    "seq_len",
    "global_batch",
    "dp",
    "tp",
    "pp",
    "cfg_n_layers",
    "cfg_hidden",
    "cfg_heads",
    "cfg_vocab",
)
_GPT2_ARCH = "GPT2LMHeadModel"


def read_neusight_e2e(path: str | Path) -> ReadResult:
    """Read NeuSight's whole-model latencies into run records.

    One row is one HF model (full depth) on one GPU, or on one 4-GPU node with one of
    DP=4, TP=4 or PP=4 (HF ``accelerate`` with the Megatron-LM plugin). Inference rows time
    the forward under ``no_grad`` (``timing_scope="fwd"``); training rows time forward +
    backward of a cross-entropy loss with **no optimizer step** (``"fwd_bwd"``).
    ``measured_step_ms`` = ``e2e_latency_ms``: per global batch, ms (single GPU: mean of the
    5 fastest of 25 runs; 4 GPUs: mean of the 10 fastest of 50 steps, rank 0).

    Fields and assumptions:

    * model: ``num_layers, hidden_size, num_heads, vocab_size`` from ``cfg_*``;
      ``num_kv_heads = num_heads`` (all are multi-head attention); ``ffn_hidden_size`` from
      ``cfg_ffn``, or ``4 * hidden`` for GPT-2 models whose config leaves ``n_inner`` unset
      (HF's default); ``num_experts`` = ``cfg_num_experts`` with ``top_k = 1`` (Switch
      routing) when there is more than one expert; ``vocab_size`` unpadded (HF).
    * ``micro_batch = global_batch / dp / m`` with ``m = pp_num_microbatches`` when ``pp > 1``
      else 1; a row where that is not a whole number is rejected.
    * ``dtype="fp32"``, ``recompute="none"``, ``flash_attention=False`` (eager attention),
      ``tied_embeddings=True`` (HF ties the LM head to the input embedding for these
      models by default), ``cp = ep = vpp = 1``, no sequence parallelism, ZeRO stage 0,
      full fine-tune, ``gpus_per_node = num_gpus`` (one node), ``gpu`` from the label
      directory (module docstring).
    * **Not all are causal decoders.** ``bert_large`` (``BertLMHeadModel``) is an encoder
      with bidirectional attention, and ``switchxl4`` is an encoder-decoder
      (``SwitchTransformersForConditionalGeneration``). They are kept, with the HF class
      in ``architecture`` (= ``model_arch``) so a consumer that assumes a GPT-style decoder
      can filter them out.

    Args:
        path: ``neusight_e2e_latency.csv`` (or a table with its columns).

    Returns:
        ``records``: the run-table columns, ``num_experts, top_k, tied_embeddings,
        flash_attention, model``, ``timing_scope``, ``measured_step_ms``, ``source``
        (``"neusight:<source_path>"``) and provenance ``architecture``, ``model_arch``,
        ``mode``, ``fused_kernels`` (``torch.compile``), ``source_row``. ``rejected``:
        rows with an unknown mode, a missing/non-positive time or field, or a
        non-integral micro-batch, with a ``reason``.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_source(path, E2E_REQUIRED, "NeuSight e2e")
    reasons = RejectionReasons(len(raw))
    num = numeric_columns(
        raw, (*_E2E_INT_COLUMNS, "pp_num_microbatches", "cfg_ffn", "cfg_num_experts", "e2e_latency_ms")
    )
    for col in _E2E_INT_COLUMNS:
        reasons.add(bad_positive_int(num[col]).to_numpy(), f"{col} is not a positive integer")
    time = num["e2e_latency_ms"]
    reasons.add(bad_time(time).to_numpy(), "e2e_latency_ms is missing or not a positive number")
    mode = raw["mode"].astype("string").str.strip().str.lower()
    scope = mode.map(lambda v: _TIMING_SCOPES.get(v) if isinstance(v, str) else None).astype(object)
    reasons.add(scope.isna().to_numpy(dtype=bool), f"mode is not one of {', '.join(_TIMING_SCOPES)}")
    dtype = checked_dtypes(raw["dtype"], reasons)
    reasons.add((dtype.notna() & (dtype != E2E_DTYPE)).to_numpy(dtype=bool), "dtype is not float32")

    pp = num["pp"]
    microbatches = num["pp_num_microbatches"].where(pp > 1, 1.0)
    bad_microbatches = (pp > 1) & bad_positive_int(num["pp_num_microbatches"])
    reasons.add(bad_microbatches.to_numpy(), "pp_num_microbatches is not a positive integer")
    micro = num["global_batch"] / num["dp"] / microbatches
    inputs_ok = ~(bad_positive_int(num["global_batch"]) | bad_positive_int(num["dp"]) | bad_microbatches)
    reasons.add(
        (inputs_ok & bad_positive_int(micro)).to_numpy(),
        "micro_batch = global_batch / dp / pp_num_microbatches is not a positive integer",
    )
    arch = raw["model_arch"].astype("string").str.strip()
    ffn = num["cfg_ffn"].where(num["cfg_ffn"].notna() | (arch != _GPT2_ARCH).fillna(True), 4 * num["cfg_hidden"])
    reasons.add((num["cfg_ffn"].notna() & bad_positive_int(ffn)).to_numpy(), "cfg_ffn is not a positive integer")
    experts = num["cfg_num_experts"]
    reasons.add((experts.notna() & bad_positive_int(experts)).to_numpy(), "cfg_num_experts is not a positive integer")
    ok, rejected = reasons.split(raw, path)

    good = raw[ok]
    n = num[ok]
    ints = n[list(_E2E_INT_COLUMNS)].astype("int64")
    moe = n["cfg_num_experts"].fillna(1) > 1
    fused = good["fused_kernels"].astype("string").str.strip().str.lower().map({"true": True, "false": False})
    out = pd.DataFrame(
        {
            "num_layers": ints["cfg_n_layers"],
            "hidden_size": ints["cfg_hidden"],
            "num_heads": ints["cfg_heads"],
            "num_kv_heads": ints["cfg_heads"],
            "ffn_hidden_size": ffn[ok].round().astype("Int64"),
            "vocab_size": ints["cfg_vocab"],
            "seq_len": ints["seq_len"],
            "tp": ints["tp"],
            "pp": ints["pp"],
            "dp": ints["dp"],
            "cp": 1,
            "ep": 1,
            "micro_batch": micro[ok].round().astype("int64"),
            "global_batch": ints["global_batch"],
            "vpp": 1,
            "sequence_parallel": False,
            "zero_stage": 0,
            "recompute": "none",
            "finetune": "full",
            "lora_rank": 0,
            "dtype": dtype[ok],
            "gpu": label_to_device(good["gpu"]),
            "num_gpus": ints["n_gpus"],
            "gpus_per_node": ints["n_gpus"],
            "num_experts": n["cfg_num_experts"].where(moe).round().astype("Int64"),
            "top_k": pd.Series(1, index=good.index, dtype="Int64").where(moe),
            "tied_embeddings": True,
            "flash_attention": False,
            "model": good["model"].astype(object),
            "timing_scope": scope[ok],
            RUN_MEASURED_COLUMN: time[ok],
            "source": SOURCE_NAME + ":" + good["source_path"].astype(str),
            "architecture": arch[ok].astype(object),
            "model_arch": good["model_arch"].astype(object),
            "mode": mode[ok].astype(object),
            "fused_kernels": fused.astype("boolean"),
            "source_row": good.index.to_numpy(),
        },
        index=good.index,
    )
    ordered = [*RUN_COLUMNS, *(c for c in out.columns if c not in RUN_COLUMNS)]
    return ReadResult(records=out[ordered].reset_index(drop=True), rejected=rejected)
