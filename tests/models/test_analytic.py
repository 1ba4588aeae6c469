"""Sanity tests of the analytic step predictor (roofline + alpha-beta + schedule), through the
batch path every front door uses (``predict_steps_table`` with the analytic predictor)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.data.tables import ERROR_COLUMN, read_table
from perfcast.features.run_config import parse_run_row
from perfcast.features.workload import Scope, build_workload_graph
from perfcast.models.analytic import model_flops_per_step
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.batch import predict_steps_table
from perfcast.serve.cli.predict_cmd import _example

BASE = {"model": "gpt3-1.3b", "gpu": "h100-sxm5-80gb", "dp": 8, "micro_batch": 4, "global_batch": 256}


def _predict_rows(rows: list[dict]) -> pd.DataFrame:
    return predict_steps_table(pd.DataFrame(rows), predictor=StepPredictor.analytic())


def _predict(**update) -> pd.Series:
    """The analytic prediction of ``BASE`` updated: one output row, which must be valid."""
    out = _predict_rows([{**BASE, **update}])
    assert out[ERROR_COLUMN].iloc[0] == ""
    return out.iloc[0]


def test_doubling_global_batch_roughly_doubles_step_time():
    one, two = _predict(), _predict(global_batch=512)
    assert 1.8 < two["step_ms"] / one["step_ms"] <= 2.0


def test_tokens_per_s_is_consistent_with_step_time():
    pred = _predict()
    seq_len = parse_run_row(BASE).model.seq_len
    assert pred["tokens_per_s"] == pytest.approx(256 * seq_len / (pred["step_ms"] / 1e3), rel=1e-12)


def test_bf16_on_h100_is_faster_than_on_a100():
    h100, a100 = _predict(), _predict(gpu="a100-sxm4-80gb")
    assert h100["step_ms"] < a100["step_ms"]
    assert h100["tokens_per_s"] > a100["tokens_per_s"]


def test_mfu_of_the_packaged_examples_is_a_fraction():
    out = _predict_rows(read_table(_example("runs.csv")).to_dict("records"))
    valid = out[out[ERROR_COLUMN] == ""]
    assert len(valid) >= 10
    assert ((valid["mfu"] > 0) & (valid["mfu"] <= 1)).all()
    assert (valid["step_ms"] > 0).all() and (valid["tokens_per_s"] > 0).all()
    assert valid["fits_memory"].map(type).eq(bool).all()


@pytest.mark.parametrize("seq_len", [2048, 8192, 32768])
def test_mfu_stays_below_one_at_long_sequences(seq_len):
    # the attention FLOPs grow with the sequence; a lower-bound predictor must still give MFU <= 1
    row = {
        "num_layers": 4,
        "hidden_size": 1024,
        "num_heads": 8,
        "vocab_size": 1000,
        "seq_len": seq_len,
        "position_embedding": "rope",
        "gpu": "h100-sxm5-80gb",
        "global_batch": 2,
    }
    out = _predict_rows([row])
    assert out[ERROR_COLUMN].iloc[0] == "" and 0 < out["mfu"].iloc[0] <= 1
    cfg = parse_run_row(row)
    graph = build_workload_graph(cfg.model, cfg.parallel, cfg.cluster)
    n = graph.nodes  # FLOPs one GPU of the busiest stage executes in a step
    runs = np.where(n["scope"] == Scope.STEP, 1, graph.num_microbatches) * n["scope"].map(graph.scope_multiplicity())
    assert model_flops_per_step(cfg) <= (n["flops"] * n["repeat"] * runs).sum() * cfg.cluster.num_gpus


def test_lora_counts_fewer_model_flops():
    single = {"model": "llama2-7b", "dp": 1, "micro_batch": 1, "global_batch": 1}
    full = parse_run_row({**BASE, **single})
    lora = parse_run_row({**BASE, **single, "finetune": "lora", "lora_rank": 8})
    diff = model_flops_per_step(full) - model_flops_per_step(lora)
    assert diff == pytest.approx(2 * full.model.num_matmul_params * full.tokens_per_step, rel=1e-12)
    assert _predict(**single, finetune="lora", lora_rank=8)["step_ms"] < _predict(**single)["step_ms"]


def test_packed_documents_count_attention_over_the_document():
    single = {"model": "llama2-7b", "dp": 1, "micro_batch": 1, "global_batch": 1}
    whole = parse_run_row({**BASE, **single, "finetune": "sft"})
    packed = parse_run_row({**BASE, **single, "finetune": "sft", "document_tokens": 512})
    m = whole.model
    causal_per_token = 6 * m.num_layers * m.num_heads * m.head_size  # per token of attention length
    diff = model_flops_per_step(whole) - model_flops_per_step(packed)
    assert diff == pytest.approx(causal_per_token * (m.seq_len - 512) * whole.tokens_per_step, rel=1e-12)
    sft = {**single, "finetune": "sft"}
    assert _predict(**sft, document_tokens=512)["step_ms"] < _predict(**sft)["step_ms"]


def test_overlapping_the_gradient_reduction_helps():
    overlapped, exposed = _predict(overlap_grad_reduce=True), _predict(overlap_grad_reduce=False)
    assert overlapped["step_ms"] <= exposed["step_ms"]


def test_memory_and_fits():
    pred = _predict(model="llama2-70b", dp=1, micro_batch=1, global_batch=1)
    assert not pred["fits_memory"] and pred["peak_mem_gib"] > 80
    assert _predict()["fits_memory"]
