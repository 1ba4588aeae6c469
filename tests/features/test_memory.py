"""Tests of peak memory: Korthikanti et al. 2022 activations, ZeRO sharding, fits_memory."""

from __future__ import annotations

import pytest

from perfcast.features.hardware import ClusterSpec
from perfcast.features.memory import (
    GIB,
    USABLE_MEMORY_FRACTION,
    MemoryBreakdown,
    activation_bytes_per_layer,
    peak_memory,
)
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import ParallelConfig, padded_vocab_size

# GPT as in the paper: multi-head attention, ffn = 4h, plain (not gated) MLP
GPT = TransformerSpec(num_layers=8, hidden_size=1024, num_heads=16, vocab_size=1000, seq_len=2048)
S, B, H, A = GPT.seq_len, 2, GPT.hidden_size, GPT.num_heads
SBH = S * B * H


def _act(**fields) -> float:
    fields.setdefault("global_batch", B)
    fields.setdefault("flash_attention", False)  # the paper's unfused attention keeps the scores
    return activation_bytes_per_layer(GPT, ParallelConfig(micro_batch=B, **fields))


def test_model_is_the_papers_gpt():
    assert GPT.ffn_size == 4 * H and not GPT.gated_mlp and GPT.kv_heads == A


def test_no_parallelism():
    assert _act() == pytest.approx(SBH * (34 + 5 * A * S / H), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel(t):
    assert _act(tp=t) == pytest.approx(SBH * (10 + 24 / t + 5 * A * S / (H * t)), rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_and_sequence_parallel(t):
    assert _act(tp=t, sequence_parallel=True) == pytest.approx(SBH / t * (34 + 5 * A * S / H), rel=1e-12)


@pytest.mark.parametrize("t", [1, 4])
def test_selective_recompute_drops_the_attention_term(t):
    assert _act(tp=t, sequence_parallel=t > 1, recompute="selective") == pytest.approx(34 * SBH / t, rel=1e-12)
    assert _act(tp=4, recompute="selective") == pytest.approx(SBH * (10 + 24 / 4), rel=1e-12)


def test_flash_attention_keeps_no_scores():
    assert _act(tp=4, sequence_parallel=True, flash_attention=True) == pytest.approx(34 * SBH / 4, rel=1e-12)


@pytest.mark.parametrize(
    ("t", "sp", "expected"), [(1, False, 16 * SBH), (4, False, SBH * (2 + 14 / 4)), (4, True, SBH * (6 + 14) / 4)]
)
def test_op_sac_keeps_the_input_the_attention_output_and_the_odd_matmuls_outputs(t, sp, expected):
    """Per sbh, 16-bit, the paper's GPT (plain MLP, ffn 4h) with fused attention: the matmuls
    q k v o up down keep q, v and up (2 + 2 + 8) and the attention output (2), split over tp: 14;
    the layer input (2) whole, or split with the two reduce-scatter outputs (4 more) under
    sequence parallelism. An unfused attention core is replayed, its output not kept."""
    sac = {"tp": t, "sequence_parallel": sp, "recompute": "op-sac"}
    assert _act(**sac, flash_attention=True) == pytest.approx(expected, rel=1e-12)
    assert _act(**sac) == pytest.approx(expected - 2 * SBH / t, rel=1e-12)


def test_op_sac_counts_a_windowed_layers_attention_output_once():
    """gpt-oss splits a layer's heads into windowed and full attention nodes: their outputs add up to
    one attention output, as without the window."""
    gpt_oss = TransformerSpec.from_name("gpt-oss-20b")
    p = ParallelConfig(micro_batch=1, global_batch=1, recompute="op-sac")
    unwindowed = gpt_oss.model_copy(update={"sliding_window": None})
    assert activation_bytes_per_layer(gpt_oss, p, moe=True) == activation_bytes_per_layer(unwindowed, p, moe=True)


def test_op_sac_keeps_a_gated_mlps_down_projection_whole():
    """Gated MLP (q k v o gate up down): gate and down are kept; down's output is the partial sum
    before the reduce-scatter, h wide on every rank."""
    llama = TransformerSpec.from_name("llama2-7b")
    p = ParallelConfig(tp=4, sequence_parallel=True, micro_batch=1, global_batch=1, recompute="op-sac")
    sbh, f = llama.seq_len * llama.hidden_size, llama.ffn_size / llama.hidden_size
    assert activation_bytes_per_layer(llama, p) == pytest.approx(sbh * ((6 + 2 * (3 + f)) / 4 + 2), rel=1e-12)


@pytest.mark.parametrize(("t", "sp", "expected"), [(1, False, 2 * SBH), (4, False, 2 * SBH), (4, True, 2 * SBH / 4)])
def test_full_recompute_keeps_the_layer_input(t, sp, expected):
    assert _act(tp=t, sequence_parallel=sp, recompute="full") == pytest.approx(expected, rel=1e-12)


def test_context_parallel_splits_the_sequence():
    assert _act(cp=2, flash_attention=True) == pytest.approx(34 * (S // 2) * B * H, rel=1e-12)


# ------------------------------------------------------------------ peak memory


def _peak(model: TransformerSpec, n: int, gpu: str = "h100-sxm5-80gb", **fields) -> MemoryBreakdown:
    return peak_memory(model, ParallelConfig(**fields), ClusterSpec.build(gpu, n))


def test_zero_stages_shard_optimizer_then_gradients_then_weights():
    llama = TransformerSpec.from_name("llama2-7b")
    z = [_peak(llama, 8, dp=8, global_batch=8, zero_stage=s) for s in range(4)]
    assert z[1].optimizer_gib == pytest.approx(z[0].optimizer_gib / 8, rel=1e-12)
    assert z[1].grads_gib == z[0].grads_gib and z[1].weights_gib == z[0].weights_gib
    assert z[2].grads_gib == pytest.approx(z[0].grads_gib / 8, rel=1e-12)
    assert z[2].optimizer_gib == z[1].optimizer_gib and z[2].weights_gib == z[0].weights_gib
    assert z[3].weights_gib == pytest.approx(z[0].weights_gib / 8, rel=1e-12)
    assert z[3].grads_gib == z[2].grads_gib and z[3].optimizer_gib == z[1].optimizer_gib
    assert len({m.activations_gib for m in z}) == 1
    assert z[0].total_gib > z[1].total_gib > z[2].total_gib > z[3].total_gib


def test_model_state_bytes_per_parameter():
    bf16 = _peak(GPT, 1, global_batch=1)
    assert bf16.grads_gib == pytest.approx(bf16.weights_gib, rel=1e-12)
    assert bf16.optimizer_gib == pytest.approx(6 * bf16.weights_gib, rel=1e-12)  # 12 vs 2 bytes
    fp32 = _peak(GPT, 1, global_batch=1, dtype="fp32")
    assert fp32.weights_gib == pytest.approx(2 * bf16.weights_gib, rel=1e-12)
    assert fp32.optimizer_gib == pytest.approx(2 * fp32.weights_gib, rel=1e-12)  # 8 vs 4 bytes


def test_lora_keeps_states_only_for_the_adapters():
    llama = TransformerSpec.from_name("llama2-7b")
    full = _peak(llama, 1, global_batch=1)
    lora = _peak(llama, 1, global_batch=1, finetune="lora", lora_rank=16)
    assert lora.weights_gib == pytest.approx(full.weights_gib, rel=0.01)
    assert lora.grads_gib < 0.01 * full.grads_gib and lora.optimizer_gib < 0.01 * full.optimizer_gib


def test_fsdp_shards_lora_frozen_weights_as_it_gathers_them():
    """ZeRO-3 (FSDP) shards every parameter, the frozen base included; stages 1-2 leave weights whole."""
    llama = TransformerSpec.from_name("llama2-7b")
    lora = {"finetune": "lora", "lora_rank": 16, "global_batch": 8, "dp": 8}
    whole, fsdp = (_peak(llama, 8, zero_stage=z, **lora) for z in (1, 3))
    assert fsdp.weights_gib == pytest.approx(whole.weights_gib / 8, rel=1e-12)
    one_gpu = _peak(llama, 1, global_batch=1, finetune="lora", lora_rank=16)
    assert whole.weights_gib == pytest.approx(one_gpu.weights_gib, rel=1e-12)


def test_activations_count_in_flight_microbatches_and_logits():
    per_layer = _act(flash_attention=True)
    one = _peak(GPT, 1, micro_batch=B, global_batch=B)
    logits = 4.0 * B * S * padded_vocab_size(GPT, 1)
    assert one.activations_gib * GIB == pytest.approx(GPT.num_layers * per_layer + logits, rel=1e-12)
    # 1F1B: the first stage holds min(m, pp) microbatches
    pp = _peak(GPT, 4, pp=4, micro_batch=B, global_batch=8 * B)
    assert pp.activations_gib * GIB == pytest.approx(GPT.num_layers // 4 * per_layer * 4, rel=1e-12)
    few = _peak(GPT, 4, pp=4, micro_batch=B, global_batch=2 * B)
    assert few.activations_gib == pytest.approx(pp.activations_gib / 2, rel=1e-12)
    # interleaved: times 1 + (pp-1)/(pp*vpp)
    inter = _peak(GPT, 4, pp=4, vpp=2, micro_batch=B, global_batch=8 * B)
    assert inter.activations_gib == pytest.approx(pp.activations_gib * (1 + 3 / 8), rel=1e-12)


def test_total_and_fits():
    m = MemoryBreakdown(weights_gib=10, grads_gib=10, optimizer_gib=40, activations_gib=12)
    assert m.total_gib == 72
    assert m.fits(72 / USABLE_MEMORY_FRACTION)
    assert not m.fits(71.9 / USABLE_MEMORY_FRACTION)


def test_fits_memory_flips_when_the_model_is_too_large():
    big = _peak(TransformerSpec.from_name("llama2-70b"), 1, global_batch=1)
    assert big.weights_gib > 80 and not big.fits(80)
    small = _peak(TransformerSpec.from_name("gpt3-125m"), 1, global_batch=1)
    assert small.fits(80)
    # sharding the 70B over 64 GPUs with ZeRO-3 and tp=8 brings it back
    sharded = _peak(
        TransformerSpec.from_name("llama2-70b"),
        64,
        tp=8,
        dp=8,
        global_batch=8,
        zero_stage=3,
        sequence_parallel=True,
        recompute="full",
    )
    assert sharded.fits(80)


def test_peak_memory_table_equals_peak_memory_per_config():
    import pandas as pd

    from perfcast.features.memory import peak_memory_table
    from perfcast.features.run_config import parse_run_table

    base = {"model": "llama2-7b", "gpu": "h100-sxm5-80gb", "micro_batch": 2, "global_batch": 64}
    rows = [
        {**base, "dp": 8},
        {**base, "dp": 8, "gpu": "a100-sxm4-80gb"},  # memory does not depend on the GPU
        {**base, "tp": 2, "pp": 2, "dp": 2, "vpp": 2, "sequence_parallel": True, "recompute": "selective"},
        {**base, "tp": 2, "pp": 2, "dp": 2, "vpp": 2, "global_batch": 8},  # fewer microbatches than in flight
        {**base, "dp": 8, "zero_stage": 3, "recompute": "full"},
        {**base, "dp": 8, "zero_stage": 2, "dtype": "fp32", "flash_attention": False},
        {**base, "tp": 2, "dp": 4, "finetune": "lora", "lora_rank": 8},
        {**base, "model": "mixtral-8x7b", "tp": 2, "pp": 2, "dp": 4, "ep": 4, "zero_stage": 1, "cp": 2,
         "num_gpus": 32},
        {**base, "tp": 2, "dp": 4, "recompute": "op-sac", "framework": "torchtitan"},
        {**base, "tp": 2, "dp": 4, "recompute": "op-sac", "framework": "torchtitan", "finetune": "lora",
         "lora_rank": 8},  # the adapters' matmuls shift which outputs op-sac keeps
    ]  # fmt: skip
    configs = parse_run_table(pd.DataFrame(rows + rows))  # rows share their spec objects
    got = peak_memory_table(configs)
    for i, c in enumerate(configs):
        expected = peak_memory(c.model, c.parallel, c.cluster)
        assert got.loc[i, list(MemoryBreakdown.__dataclass_fields__)].tolist() == list(vars(expected).values())
        assert got.loc[i, "peak_mem_gib"] == expected.total_gib
        assert got.loc[i, "fits_memory"] == expected.fits(c.cluster.gpu.mem_gib)
    assert got.loc[0, "peak_mem_gib"] == got.loc[1, "peak_mem_gib"]  # the GPU does not matter
    assert got.loc[2, "activations_gib"] != got.loc[3, "activations_gib"]  # the microbatches in flight do
    assert got.loc[8, "activations_gib"] != got.loc[9, "activations_gib"]  # so do LoRA adapters under op-sac
    assert not got["fits_memory"].all() and got["fits_memory"].any()


# ------------------------------------------------------------------ uneven pipeline stages


def test_uneven_stages_peak_at_the_fullest_rank():
    from perfcast.features.memory import peak_memory_table
    from perfcast.features.run_config import parse_run_row

    row = {"model": "llama3.1-405b", "tp": 8, "pp": 8, "dp": 1, "micro_batch": 1, "global_batch": 16,
           "gpu": "h100-sxm5-80gb", "sequence_parallel": True}  # fmt: skip
    uneven = parse_run_row(row)  # 126 layers: 15, 16 * 6, 15 (the embedding and the loss count as layers)
    even = {n: parse_run_row({**row, "num_layers": n}) for n in (120, 128)}
    peak = {n: peak_memory(c.model, c.parallel, c.cluster) for n, c in even.items()}
    got = peak_memory(uneven.model, uneven.parallel, uneven.cluster)
    # rank 0 (15 layers, 8 microbatches in flight) outweighs rank 1 (16 layers, 7 in flight): as 120 layers
    assert got.activations_gib == pytest.approx(peak[120].activations_gib, rel=1e-12)
    assert got.total_gib == pytest.approx(peak[120].total_gib, rel=1e-12)
    assert got.total_gib < peak[128].total_gib
    table = peak_memory_table([uneven, even[128]])
    assert table["peak_mem_gib"].tolist() == pytest.approx([got.total_gib, peak[128].total_gib], rel=1e-12)


def test_interleaved_in_flight_per_rank_matches_the_first_stage_rule():
    model = GPT.model_copy(update={"num_layers": 10})
    p = ParallelConfig(pp=2, vpp=2, global_batch=4, first_stage_layers=6, last_stage_layers=4)
    got = peak_memory(model, p, ClusterSpec.build("h100-sxm5-80gb", 2))
    per_layer = activation_bytes_per_layer(model, p)
    # rank 0: 6 layers, 2 * (1 + 1 / 4) = 2.5 microbatches in flight; rank 1: 4 layers, (2 + 1) / 2 = 1.5
    assert got.activations_gib == pytest.approx(6 * per_layer * 2.5 / GIB, rel=1e-12)
