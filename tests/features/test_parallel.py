"""Tests of the parallel layout: ParallelConfig's own rules, check_layout, vocab padding."""

from __future__ import annotations

import re

import pytest

from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import (
    DEFAULT_SPLIT_NAME,
    Finetune,
    ParallelConfig,
    Recompute,
    check_layout,
    padded_vocab_size,
    pipeline_split,
)

GPT = TransformerSpec(num_layers=4, hidden_size=512, num_heads=8, vocab_size=1000, seq_len=256)


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


def test_ep_times_etp_must_divide_the_stage_ranks():
    with _raises(ValueError, "ep*etp=4*1=4 does not divide tp*cp*dp=1*1*2=2"):
        ParallelConfig(dp=2, ep=4, global_batch=2)
    with _raises(ValueError, "ep*etp=4*1=4 does not divide tp*cp*dp=1*1*6=6"):
        ParallelConfig(dp=6, ep=4, global_batch=6)
    ParallelConfig(dp=2, cp=2, ep=4, global_batch=2)  # ep spans dp*cp
    ParallelConfig(tp=2, dp=2, ep=4, global_batch=2)  # ep folds over tp too (Megatron-Core)


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
    llama = TransformerSpec.from_name("llama2-7b")
    with _raises(SpecError, "tp=3 does not divide num_heads=32"):
        check_layout(llama, ParallelConfig(tp=3, global_batch=1), _cluster(3))


def test_tp_and_kv_heads_must_nest():
    model = TransformerSpec(num_layers=2, hidden_size=768, num_heads=12, num_kv_heads=4, vocab_size=1000)
    with _raises(SpecError, "tp=3 and num_kv_heads=4: one must divide the other"):
        check_layout(model, ParallelConfig(tp=3, global_batch=1), _cluster(3))
    # more tp ranks than KV heads replicates them: allowed
    mqa = TransformerSpec(num_layers=2, hidden_size=512, num_heads=8, num_kv_heads=2, vocab_size=1000)
    check_layout(mqa, ParallelConfig(tp=4, global_batch=1), _cluster(4))


def test_tp_must_divide_ffn():
    model = GPT.model_copy(update={"ffn_hidden_size": 1001})
    with _raises(SpecError, "tp=2 does not divide ffn_hidden_size=1001"):
        check_layout(model, ParallelConfig(tp=2, global_batch=1), _cluster(2))


def test_more_virtual_stages_than_layers_is_refused():
    with _raises(SpecError, "pp*vpp=2*4=8 exceeds num_layers=4: every virtual pipeline stage needs a layer; "
                            "allowed: vpp at most 2"):  # fmt: skip
        check_layout(GPT, ParallelConfig(pp=2, vpp=4, global_batch=8), _cluster(2))
    six = GPT.model_copy(update={"num_layers": 6})  # 6 + embedding + loss = 8 stages: the switches are named
    with _raises(SpecError, "or state account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split"):
        check_layout(six, ParallelConfig(pp=2, vpp=4, global_batch=8), _cluster(2))
    with _raises(SpecError, "pp*vpp=8*1=8 exceeds num_layers=4: every virtual pipeline stage needs a layer; "
                            "allowed: pp at most 4"):  # fmt: skip
        check_layout(GPT, ParallelConfig(pp=8, global_batch=8), _cluster(8))
    counted = ParallelConfig(pp=2, vpp=4, global_batch=8, account_for_embedding_in_pipeline_split=True,
                             account_for_loss_in_pipeline_split=True)  # fmt: skip
    check_layout(six, counted, _cluster(2))


def test_pp_not_dividing_layers_takes_the_default_split():
    check_layout(GPT, ParallelConfig(pp=3, global_batch=6), _cluster(3))  # 4 layers: 1, 2, 1 (+ embedding, loss)
    assert pipeline_split(4, ParallelConfig(pp=3, global_batch=6)).layers == (1, 2, 1)


def test_interleaved_schedule_needs_microbatches_multiple_of_pp():
    allowed = "allowed: a global_batch that makes it one (a multiple of 2)"
    with _raises(SpecError, f"= 3, to be a multiple of pp=2; {allowed}"):
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
    mixtral = TransformerSpec.from_name("mixtral-8x7b")
    with _raises(SpecError, "ep=3 does not divide num_experts=8"):
        check_layout(mixtral, ParallelConfig(dp=6, ep=3, global_batch=6), _cluster(6))


def test_etp_must_divide_expert_ffn():
    moe = TransformerSpec(
        num_layers=2,
        hidden_size=512,
        num_heads=8,
        vocab_size=1000,
        ffn_hidden_size=1024,
        num_experts=4,
        top_k=2,
        moe_ffn_hidden_size=1001,
    )
    check_layout(moe, ParallelConfig(tp=2, global_batch=1), _cluster(2))  # experts split over etp=1, not tp
    with _raises(SpecError, "etp=2 does not divide the expert ffn size moe_ffn_hidden_size=1001"):
        check_layout(moe, ParallelConfig(tp=2, etp=2, global_batch=1), _cluster(2))


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


# ------------------------------------------------------------------ pipeline split

EMB, LOSS = "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"
FIRST, LAST = "first_stage_layers", "last_stage_layers"


def _split(num_layers: int, pp: int, vpp: int = 1, **switches):
    return pipeline_split(num_layers, ParallelConfig(pp=pp, vpp=vpp, global_batch=pp, **switches))


def test_even_split_states_no_default():
    split = _split(32, 4, 2)
    assert split.layers == (4,) * 8 and split.rank_layers == (8,) * 4
    assert split.is_even and split.defaulted == ()


def test_account_switches_count_embedding_and_loss_as_layers():
    # Megatron-Core: (126 + 2) / (8 * 8) = 2 per virtual stage; the first and last build one less
    split = _split(126, 8, 8, **{EMB: True, LOSS: True})
    assert split.layers[0] == 1 and split.layers[-1] == 1 and set(split.layers[1:-1]) == {2}
    assert split.rank_layers == (15, 16, 16, 16, 16, 16, 16, 15) and split.defaulted == ()
    assert _split(31, 8, **{LOSS: True}).rank_layers == (4,) * 7 + (3,)
    assert _split(31, 8, **{EMB: True}).rank_layers == (3,) + (4,) * 7


def test_first_and_last_stage_layers_split_the_rest_evenly():
    split = _split(126, 8, 2, **{FIRST: 14, LAST: 16})
    assert split.rank_layers == (14,) + (16,) * 7 and split.layers[0] == split.layers[8] == 7
    assert _split(10, 2, **{FIRST: 4, LAST: 6}).rank_layers == (4, 6)
    assert _split(13, 4, **{LAST: 4}).rank_layers == (3, 3, 3, 4)


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "ranks", "defaulted"),
    [
        (126, 8, 8, (15,) + (16,) * 6 + (15,), (EMB, LOSS)),  # Llama 3.1 405B, the NeMo recipe's split
        (126, 8, 1, (15,) + (16,) * 6 + (15,), (EMB, LOSS)),
        (32, 3, 1, (11, 11, 10), (LOSS,)),
        (61, 8, 1, (7,) + (8,) * 6 + (6,), (FIRST, LAST)),  # DeepSeek-V3 / Kimi-K2 depth
        (61, 4, 1, (15, 16, 16, 14), (FIRST, LAST)),
        (61, 4, 8, (15, 16, 16, 14), (DEFAULT_SPLIT_NAME,)),
        (61, 8, 4, (7,) + (8,) * 6 + (6,), (DEFAULT_SPLIT_NAME,)),
        (61, 2, 2, (31, 30), (DEFAULT_SPLIT_NAME,)),
    ],
)
def test_default_split_when_pp_times_vpp_does_not_divide(layers, pp, vpp, ranks, defaulted):
    split = _split(layers, pp, vpp)
    assert split.rank_layers == ranks and split.defaulted == defaulted
    assert sum(split.layers) == layers and min(split.layers) >= 1 and len(split.layers) == pp * vpp
    assert max(split.layers) - min(split.layers) <= 1 or defaulted == (FIRST, LAST)


def test_default_spread_keeps_the_end_virtual_stages_light():
    split = _split(61, 4, 8)  # 32 virtual stages, 29 of them take a second layer
    assert split.layers[0] == 1 and split.layers[-1] == 1
    assert all(split.layers[c * 4 + r] == 2 for c in range(8) for r in (1, 2))  # middle ranks first


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "switches", "text"),
    [
        (126, 8, 2, {FIRST: 15}, "first_stage_layers=15 is not a multiple of vpp=2"),
        (126, 8, 1, {FIRST: 20, LAST: 20}, "leave 86 of num_layers=126 layers, which do not split evenly over the 6"),
        (126, 8, 1, {FIRST: 100, LAST: 24}, "leave 2 of num_layers=126 for 6 other pipeline ranks"),
        (10, 2, 1, {FIRST: 4, LAST: 5}, "first_stage_layers=4, last_stage_layers=5 hold 9 layers but num_layers=10"),
        (126, 8, 2, {EMB: True}, "pp*vpp=8*2=16 does not divide num_layers+1=127 (num_layers=126"),
        (126, 8, 1, {FIRST: 14, LOSS: True}, "first_stage_layers=14 with account_for_loss_in_pipeline_split=true"),
        (8, 1, 1, {LAST: 8}, "last_stage_layers=8 needs pp > 1"),
    ],
)
def test_stated_split_is_checked(layers, pp, vpp, switches, text):
    with _raises(ValueError, text):  # SpecError from the split, pydantic's ValueError from ParallelConfig
        _split(layers, pp, vpp, **switches)


def test_uneven_stage_under_interleaving_names_the_megatron_switches():
    """Llama 3 405B's split (126 layers over pp=16, one layer less on the first and last stages)
    under interleaving is stated with the account_for_* switches; the refusal says so."""
    with _raises(ValueError, "allowed: a multiple of 4; to give the embedding's and the loss's stages one layer"):
        _split(126, 16, 4, **{FIRST: 7, LAST: 7})
    split = _split(126, 16, 4, **{EMB: True, LOSS: True})
    assert sum(split.layers) == 126 and split.layers[0] == 1 and split.layers[-1] == 1


def test_stated_stage_layers_must_be_positive():
    with pytest.raises(ValueError, match="first_stage_layers"):
        ParallelConfig(pp=2, global_batch=2, first_stage_layers=0)
