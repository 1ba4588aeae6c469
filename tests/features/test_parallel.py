"""Tests of the parallel layout: ParallelConfig's own rules, check_layout, vocab padding."""

from __future__ import annotations

import re

import pytest

from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import ModelSpec
from perfcast.features.parallel import Finetune, ParallelConfig, Recompute, check_layout, padded_vocab_size

GPT = ModelSpec(num_layers=4, hidden_size=512, num_heads=8, vocab_size=1000, seq_len=256)


def _cluster(n: int) -> ClusterSpec:
    return ClusterSpec.build("h100-sxm5-80gb", n)


def _raises(exc: type[Exception], text: str):
    return pytest.raises(exc, match=re.escape(text))


# ------------------------------------------------------------------ ParallelConfig


def test_defaults_are_no_parallelism():
    p = ParallelConfig(global_batch=1)
    assert (p.tp, p.pp, p.dp, p.cp, p.ep, p.vpp, p.micro_batch) == (1, 1, 1, 1, 1, 1, 1)
    assert p.recompute is Recompute.NONE and p.finetune is Finetune.FULL
    assert p.zero_stage == 0 and not p.sequence_parallel and p.flash_attention
    assert p.world_size == 1 and p.num_microbatches == 1


@pytest.mark.parametrize(
    ("fields", "microbatches", "world"),
    [
        ({"global_batch": 64, "dp": 4, "micro_batch": 2}, 8, 4),
        ({"global_batch": 512, "dp": 8, "micro_batch": 1, "tp": 8, "pp": 4}, 64, 256),
        ({"global_batch": 16, "dp": 2, "cp": 2, "micro_batch": 4}, 2, 4),
        ({"global_batch": 8, "ep": 1}, 8, 1),
    ],
)
def test_num_microbatches_and_world_size(fields, microbatches, world):
    p = ParallelConfig(**fields)
    assert p.num_microbatches == microbatches
    assert p.world_size == world


def test_global_batch_must_be_a_multiple_of_dp_times_micro_batch():
    with _raises(ValueError, "global_batch=6 is not a multiple of dp*micro_batch=2*2=4"):
        ParallelConfig(dp=2, micro_batch=2, global_batch=6)


def test_vpp_needs_pp():
    with _raises(ValueError, "vpp=2 needs pp > 1"):
        ParallelConfig(vpp=2, global_batch=1)


def test_ep_must_fit_in_the_data_parallel_ranks():
    with _raises(ValueError, "ep=4 exceeds dp*cp=2"):
        ParallelConfig(dp=2, ep=4, global_batch=2)
    with _raises(ValueError, "ep=4 does not divide dp*cp=6"):
        ParallelConfig(dp=6, ep=4, global_batch=6)
    ParallelConfig(dp=2, cp=2, ep=4, global_batch=2)  # ep spans dp*cp


def test_lora_needs_a_rank_and_a_rank_needs_lora():
    with _raises(ValueError, "finetune=lora needs lora_rank >= 1; got lora_rank=0"):
        ParallelConfig(finetune="lora", global_batch=1)
    with _raises(ValueError, "lora_rank=8 is set but finetune=full"):
        ParallelConfig(lora_rank=8, global_batch=1)
    assert ParallelConfig(finetune="lora", lora_rank=8, global_batch=1).finetune is Finetune.LORA


@pytest.mark.parametrize(
    ("field", "value"),
    [("tp", 0), ("dp", -1), ("zero_stage", 4), ("global_batch", 0), ("recompute", "sometimes"), ("dtype", "int4")],
)
def test_field_bounds_name_the_field(field, value):
    fields = {"global_batch": 1, field: value}
    with pytest.raises(ValueError, match=field):
        ParallelConfig(**fields)


def test_config_is_frozen_and_rejects_unknown_fields():
    p = ParallelConfig(global_batch=1)
    with pytest.raises(ValueError):
        p.tp = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="tensor_parallel"):
        ParallelConfig(global_batch=1, tensor_parallel=2)


# ------------------------------------------------------------------ check_layout


def test_valid_layout_passes():
    check_layout(GPT, ParallelConfig(tp=2, pp=2, dp=2, global_batch=4, sequence_parallel=True), _cluster(8))


def test_world_size_must_equal_num_gpus():
    with _raises(SpecError, "tp*pp*dp*cp=2*1*2*1=4 does not equal num_gpus=8"):
        check_layout(GPT, ParallelConfig(tp=2, dp=2, global_batch=2), _cluster(8))


def test_tp_must_divide_heads():
    llama = ModelSpec.from_name("llama2-7b")
    with _raises(SpecError, "tp=3 does not divide num_heads=32"):
        check_layout(llama, ParallelConfig(tp=3, global_batch=1), _cluster(3))


def test_tp_and_kv_heads_must_nest():
    model = ModelSpec(num_layers=2, hidden_size=768, num_heads=12, num_kv_heads=4, vocab_size=1000)
    with _raises(SpecError, "tp=3 and num_kv_heads=4: one must divide the other"):
        check_layout(model, ParallelConfig(tp=3, global_batch=1), _cluster(3))
    # more tp ranks than KV heads replicates them: allowed
    mqa = ModelSpec(num_layers=2, hidden_size=512, num_heads=8, num_kv_heads=2, vocab_size=1000)
    check_layout(mqa, ParallelConfig(tp=4, global_batch=1), _cluster(4))


def test_tp_must_divide_ffn():
    model = GPT.model_copy(update={"ffn_hidden_size": 1001})
    with _raises(SpecError, "tp=2 does not divide ffn_hidden_size=1001"):
        check_layout(model, ParallelConfig(tp=2, global_batch=1), _cluster(2))


@pytest.mark.parametrize(
    ("pp", "vpp", "text"),
    [(3, 1, "pp*vpp=3*1=3 does not divide num_layers=4"), (2, 4, "pp*vpp=2*4=8 does not divide num_layers=4")],
)
def test_pp_times_vpp_must_divide_layers(pp, vpp, text):
    with _raises(SpecError, text):
        check_layout(GPT, ParallelConfig(pp=pp, vpp=vpp, global_batch=pp * 2), _cluster(pp))


def test_interleaved_schedule_needs_microbatches_multiple_of_pp():
    with _raises(SpecError, "(3) to be a multiple of pp=2"):
        check_layout(GPT, ParallelConfig(pp=2, vpp=2, global_batch=3), _cluster(2))


def test_cp_must_divide_seq_len():
    with _raises(SpecError, "cp=3 does not divide seq_len=256"):
        check_layout(GPT, ParallelConfig(cp=3, global_batch=1), _cluster(3))


def test_sequence_parallel_needs_tp_to_divide_the_rank_sequence():
    model = GPT.model_copy(update={"seq_len": 258})
    p = ParallelConfig(tp=2, cp=2, sequence_parallel=True, global_batch=1)
    with _raises(SpecError, "sequence_parallel needs tp=2 to divide the per-rank sequence seq_len/cp=129"):
        check_layout(model, p, _cluster(4))


def test_ep_needs_moe_and_must_divide_experts():
    with _raises(SpecError, "ep=2 needs a mixture-of-experts model"):
        check_layout(GPT, ParallelConfig(dp=2, ep=2, global_batch=2), _cluster(2))
    mixtral = ModelSpec.from_name("mixtral-8x7b")
    with _raises(SpecError, "ep=3 does not divide num_experts=8"):
        check_layout(mixtral, ParallelConfig(dp=6, ep=3, global_batch=6), _cluster(6))


def test_tp_must_divide_expert_ffn():
    moe = ModelSpec(
        num_layers=2,
        hidden_size=512,
        num_heads=8,
        vocab_size=1000,
        ffn_hidden_size=1024,
        num_experts=4,
        top_k=2,
        moe_ffn_hidden_size=1001,
    )
    with _raises(SpecError, "tp=2 does not divide the expert ffn size 1001"):
        check_layout(moe, ParallelConfig(tp=2, global_batch=1), _cluster(2))


# ------------------------------------------------------------------ vocab padding


@pytest.mark.parametrize(
    ("vocab", "tp", "multiple", "padded"),
    [
        (50257, 1, 128, 50304),
        (50257, 2, 128, 50432),
        (32000, 1, 128, 32000),
        (32000, 8, 128, 32768),
        (1000, 1, 128, 1024),
        (1000, 2, 128, 1024),
        (1000, 1, 64, 1024),
        (128256, 8, 128, 129024),
    ],
)
def test_padded_vocab_size(vocab, tp, multiple, padded):
    model = GPT.model_copy(update={"vocab_size": vocab})
    got = padded_vocab_size(model, tp, multiple)
    assert got == padded
    assert got % (multiple * tp) == 0 and 0 <= got - vocab < multiple * tp
