"""Tests of run-table rows parsed into checked specs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from perfcast.errors import SpecError, UnknownEntryError
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import Finetune, Recompute
from perfcast.features.run_config import (
    DEFAULT_LORA_RANK,
    MODEL_STYLE_FIELDS,
    MOE_SHAPE_FIELDS,
    misspelt_inputs,
    parse_run_row,
    parse_run_table,
)


def test_preset_with_overrides():
    cfg = parse_run_row(
        {
            "model": "llama2-7b",
            "seq_len": 2048,
            "tp": 2,
            "dp": 4,
            "micro_batch": 2,
            "global_batch": 64,
            "gpu": "NVIDIA H100 80GB HBM3",
            "recompute": "selective",
        }
    )
    base = TransformerSpec.from_name("llama2-7b")
    assert cfg.model.seq_len == 2048 and cfg.model.hidden_size == base.hidden_size
    assert cfg.model.num_layers == base.num_layers and cfg.model.name == base.name
    assert (cfg.parallel.tp, cfg.parallel.dp, cfg.parallel.recompute) == (2, 4, Recompute.SELECTIVE)
    assert cfg.cluster.gpu.id == "h100-sxm5-80gb" and cfg.cluster.num_gpus == 8
    assert cfg.tokens_per_step == 64 * 2048


def test_model_from_fields_and_defaults():
    cfg = parse_run_row(
        {
            "num_layers": 2,
            "hidden_size": 256,
            "num_heads": 4,
            "vocab_size": 1000,
            "dp": 2,
            "micro_batch": 3,
            "gpu": "a100-sxm4-80gb",
        }
    )
    assert cfg.model.num_layers == 2 and cfg.model.ffn_size == 1024
    assert cfg.parallel.global_batch == 6  # dp * micro_batch
    assert cfg.cluster.num_gpus == 2  # tp*pp*dp*cp


def test_empty_cells_count_as_absent():
    row = {
        "model": "gpt3-125m",
        "num_layers": float("nan"),
        "seq_len": "",
        "tp": None,
        "pp": "  ",
        "dp": 2.0,
        "sequence_parallel": math.nan,
        "gpu": "h100",
        "num_gpus": float("nan"),
        "inter_node": "",
    }
    cfg = parse_run_row(row)
    base = TransformerSpec.from_name("gpt3-125m")
    assert cfg.model.num_layers == base.num_layers and cfg.model.seq_len == base.seq_len
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp) == (1, 1, 2)
    assert not cfg.parallel.sequence_parallel and cfg.cluster.num_gpus == 2


@pytest.mark.parametrize(
    ("text", "value"), [("true", True), ("1", True), ("Yes", True), ("false", False), ("0.0", False), (True, True)]
)
def test_boolean_cells(text, value):
    cfg = parse_run_row({"model": "gpt3-125m", "tp": 2, "sequence_parallel": text, "gpu": "h100"})
    assert cfg.parallel.sequence_parallel is value


def test_inter_node_fabric():
    cfg = parse_run_row({"model": "gpt3-125m", "dp": 16, "gpu": "h100", "inter_node": "roce-400gbe"})
    assert cfg.cluster.inter_node_fabric == "roce-400gbe" and cfg.cluster.num_nodes == 2


@pytest.mark.parametrize(
    ("update", "text"),
    [
        ({"tp": "abc"}, "tp='abc' is not a whole number"),
        ({"tp": 1.5}, "tp=1.5 is not a whole number"),
        ({"sequence_parallel": "maybe"}, "sequence_parallel='maybe' is not a boolean"),
        ({"recompute": "sometimes"}, "recompute='sometimes'"),
        ({"tp": 0}, "tp=0"),
        ({"seq_len": -1}, "seq_len=-1"),
        ({"dp": 2, "global_batch": 3}, "global_batch=3 is not a multiple of dp*micro_batch=2*1=2"),
        ({"tp": 3}, "tp=3 does not divide num_heads=32"),
        ({"tp": 2, "num_gpus": 8}, "tp*pp*dp*cp=2*1*1*1=2 does not equal num_gpus=8"),
        ({"gpu": ""}, "missing field gpu"),
        ({"dtype": "int4"}, "dtype='int4'"),
    ],
)
def test_bad_rows_name_field_and_value(update, text):
    row = {"model": "llama2-7b", "gpu": "h100", **update}
    with pytest.raises(SpecError) as info:
        parse_run_row(row)
    assert text in str(info.value)


def test_cross_field_rule_message_is_the_rule_only():
    with pytest.raises(SpecError) as info:
        parse_run_row({"model": "llama2-7b", "gpu": "h100", "vpp": 2})
    assert str(info.value).startswith("vpp=2 needs pp > 1")


def test_missing_model_fields_are_listed():
    with pytest.raises(SpecError, match="missing model fields hidden_size, num_heads, vocab_size"):
        parse_run_row({"num_layers": 2, "gpu": "h100"})


def test_unknown_names():
    with pytest.raises(UnknownEntryError, match="rtx-9090"):
        parse_run_row({"model": "gpt3-125m", "gpu": "rtx-9090"})
    with pytest.raises(UnknownEntryError, match="nope-7b"):
        parse_run_row({"model": "nope-7b", "gpu": "h100"})


def test_parse_run_table_gives_each_rows_config_or_error():
    import pandas as pd

    from perfcast.features.run_config import parse_run_table

    base = {"model": "llama2-7b", "gpu": "h100"}
    rows = [
        {**base, "tp": 2, "dp": 4, "global_batch": 8},
        {**base, "tp": "abc", "seq_len": -1},  # the first bad model cell wins over the parallel one
        {**base, "tp": 1.5},
        {**base, "tp": 2.0, "dp": 4, "global_batch": 8},  # the same config as the first, from a float cell
        {**base, "tp": 3},
        {**base, "gpu": " ", "tp": 2, "dp": 4, "global_batch": 8},
        {**base, "sequence_parallel": "maybe"},
        {**base, "tp": 2, "sequence_parallel": "yes", "dp": 2, "global_batch": 4, "recompute": " full "},
        {"num_layers": 2, "gpu": "h100"},
        {"model": "gpt3-125m", "gpu": "rtx-9090"},
        {**base, "gpu": "v100-sxm2-32gb", "dtype": "bf16"},
        {**base, "dp": 2, "global_batch": 3},
        {**base, "tp": 2, "num_gpus": 8, "inter_node": "ib-edr-100"},
        {**base, "tp": 8, "pp": 2, "num_gpus": 16, "gpus_per_node": 8, "inter_node": "ib-edr-100"},
    ]
    table = pd.DataFrame(rows)
    got = parse_run_table(table)
    assert len(got) == len(rows)
    for row, (_, cells), parsed in zip(rows, table.iterrows(), got, strict=True):
        try:
            expected = parse_run_row(cells.to_dict())
        except SpecError as exc:
            assert type(parsed) is type(exc) and str(parsed) == str(exc), row
        else:
            assert parsed == expected, row
    assert got[0] is not got[3] and got[0].parallel is got[3].parallel  # one spec per distinct layout
    assert sum(isinstance(p, SpecError) for p in got) == 10
    assert parse_run_table(pd.DataFrame(index=range(2)))[1].args[0].startswith("missing model fields")


def test_nullable_columns_read_their_gaps_as_empty_cells():
    import pandas as pd

    from perfcast.features.run_config import parse_run_table

    rows = [{"model": "llama2-7b", "gpu": "h100", "tp": 2, "dp": 4, "global_batch": 8, "sequence_parallel": True},
            {"model": "llama2-7b", "gpu": "h100", "tp": None, "dp": 4, "global_batch": None,
             "sequence_parallel": None}]  # fmt: skip
    plain = pd.DataFrame(rows)
    nullable = plain.convert_dtypes()  # Int64 / boolean columns with pd.NA gaps
    assert nullable["tp"].dtype == "Int64" and nullable["sequence_parallel"].dtype == "boolean"
    assert parse_run_table(nullable) == parse_run_table(plain)
    assert parse_run_row(nullable.iloc[1].to_dict()) == parse_run_row(plain.iloc[1].to_dict())


LLAMA_ON_8 = {"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 32, "micro_batch": 1, "gpu": "h100-sxm5-80gb",
              "num_gpus": 8, "dtype": "bf16", "recompute": "none", "flash_attention": True}  # fmt: skip


def test_lora_without_a_rank_gets_the_default_rank_and_says_so():
    for given in ({}, {"lora_rank": 0}, {"lora_rank": float("nan")}):
        config = parse_run_row({**LLAMA_ON_8, "finetune": "lora", **given})
        assert config.parallel.lora_rank == DEFAULT_LORA_RANK and "lora_rank" in config.defaulted
    stated = parse_run_row({**LLAMA_ON_8, "finetune": "lora", "lora_rank": 8})
    assert stated.parallel.lora_rank == 8 and "lora_rank" not in stated.defaulted


def test_sft_is_full_parameter_training_with_the_same_graph():
    from perfcast.features.workload import build_workload_graph

    full, sft = (parse_run_row({**LLAMA_ON_8, "finetune": tune}) for tune in ("full", "sft"))
    assert sft.parallel.finetune is Finetune.SFT and sft.parallel.finetune.trains_all_weights
    graphs = [build_workload_graph(c.model, c.parallel, c.cluster).nodes for c in (full, sft)]
    pd.testing.assert_frame_equal(graphs[0], graphs[1])
    with pytest.raises(SpecError, match="finetune=sft"):
        parse_run_row({**LLAMA_ON_8, "finetune": "sft", "lora_rank": 8})


BY_FIELDS = {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000}


def test_defaulted_fields_name_what_the_row_left_unstated_and_matters():
    stated = parse_run_row({**LLAMA_ON_8, "sequence_parallel": True, "zero_stage": 1, "overlap_grad_reduce": False,
                            "gpus_per_node": 8, "framework": "megatron-deepspeed", "tp_comm_overlap": False,
                            "overlap_param_gather": False, "cuda_graphs": False})  # fmt: skip
    assert stated.defaulted == ()
    bare = parse_run_row({"model": "llama2-7b", "gpu": "h100-sxm5-80gb"})
    assert set(bare.defaulted) == {"micro_batch", "global_batch", "dtype", "recompute", "flash_attention", "num_gpus",
                                   "framework", "cuda_graphs"}  # fmt: skip
    by_fields = parse_run_row({**BY_FIELDS, "gpu": "h100-sxm5-80gb"})
    assert {"seq_len", "ffn_hidden_size", "num_kv_heads", *MODEL_STYLE_FIELDS} <= set(by_fields.defaulted)
    assert not set(MOE_SHAPE_FIELDS) & set(by_fields.defaulted)
    moe = parse_run_row({**BY_FIELDS, "num_experts": 8, "gpu": "h100-sxm5-80gb"})
    assert set(MOE_SHAPE_FIELDS) <= set(moe.defaulted)
    swiglu = parse_run_row({**BY_FIELDS, "gated_mlp": True, "gpu": "h100-sxm5-80gb"})
    assert "gated_mlp" not in swiglu.defaulted and "norm" in swiglu.defaulted
    assert not set(MODEL_STYLE_FIELDS) & set(bare.defaulted)  # a preset states its architecture
    # a fine-tuning run may pack its documents: the whole-sequence default is named
    assert "document_tokens" in parse_run_row({**LLAMA_ON_8, "finetune": "sft"}).defaulted
    assert "document_tokens" not in parse_run_row({**LLAMA_ON_8, "finetune": "sft", "document_tokens": 256}).defaulted
    assert "document_tokens" not in bare.defaulted
    from_reader = parse_run_row({**LLAMA_ON_8, "defaulted_fields": "vpp, overlap_grad_reduce", "tp": 1, "dp": 8})
    assert from_reader.defaulted[:2] == ("vpp", "overlap_grad_reduce")  # the reader's names first, once each
    assert from_reader.defaulted.count("overlap_grad_reduce") == 1


@pytest.mark.parametrize(
    ("column", "field"), [("TP", "tp"), ("global_batch_size", "global_batch"), ("tensor_model_parallel_size", "tp")]
)
def test_an_input_spelt_another_way_is_an_error_not_ignored(column: str, field: str) -> None:
    base = {k: v for k, v in LLAMA_ON_8.items() if k not in (field, "num_gpus")}  # the input left to its default
    with pytest.raises(SpecError, match=f"'{column}' as '{field}'"):
        parse_run_row({**base, column: 2})
    with pytest.raises(SpecError, match=f"'{column}' as '{field}'"):  # a row given as a Series: its labels
        parse_run_row(pd.Series({**base, column: 2}))
    table = pd.DataFrame([{**base, column: 2}, {**base, column: None}, {**base, "notes": "x"}])
    first, empty, other = parse_run_table(table)
    assert isinstance(first, SpecError) and f"'{column}' as '{field}'" in str(first)
    assert not isinstance(empty, Exception) and not isinstance(other, Exception)  # empty cells and other columns pass
    assert misspelt_inputs(["notes", "tp", column]) == {column: field}
    twice = pd.DataFrame([{**base, field: 4, column: 4}, {**base, field: 4, column: 8}])
    same, other = parse_run_table(twice)
    assert not isinstance(same, Exception)  # the value said twice, once under each name
    assert isinstance(other, SpecError) and f"column '{column}'=8 conflicts with {field}=4" in str(other)


# ------------------------------------------------------------------ uneven pipeline stages

LLAMA_405B_PP8 = {"model": "llama3.1-405b", "tp": 8, "pp": 8, "vpp": 8, "dp": 1, "global_batch": 16,
                  "gpu": "h100-sxm5-80gb", "sequence_parallel": True, "micro_batch": 1}  # fmt: skip
SWITCHES = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")


def test_default_pipeline_split_is_named_in_defaulted_fields():
    config = parse_run_row(LLAMA_405B_PP8)
    assert config.defaulted[-2:] == SWITCHES
    assert not config.parallel.account_for_embedding_in_pipeline_split  # the row's fields stay as stated
    stated = parse_run_row({**LLAMA_405B_PP8, **dict.fromkeys(SWITCHES, "true")})
    assert not set(SWITCHES) & set(stated.defaulted)
    assert stated.parallel.account_for_loss_in_pipeline_split
    even = parse_run_row({**LLAMA_405B_PP8, "model": "llama3.1-70b"})  # 80 layers: no default split
    assert not set(SWITCHES) & set(even.defaulted)


def test_stage_layer_columns_are_parsed_and_checked():
    config = parse_run_row({**LLAMA_405B_PP8, "vpp": 2, "first_stage_layers": "14", "last_stage_layers": 16.0})
    assert (config.parallel.first_stage_layers, config.parallel.last_stage_layers) == (14, 16)
    assert "first_stage_layers" not in config.defaulted
    with pytest.raises(SpecError, match=r"first_stage_layers=2\.5 is not a whole number; allowed: 1\.\.10000"):
        parse_run_row({**LLAMA_405B_PP8, "first_stage_layers": 2.5})
    with pytest.raises(SpecError, match="last_stage_layers=12 is not a multiple of vpp=8"):
        parse_run_row({**LLAMA_405B_PP8, "last_stage_layers": 12})
    with pytest.raises(SpecError, match="account_for_loss_in_pipeline_split='maybe' is not a boolean"):
        parse_run_row({**LLAMA_405B_PP8, "account_for_loss_in_pipeline_split": "maybe"})
    with pytest.raises(SpecError, match=r"leave 2 of num_layers=126 for 6 other pipeline ranks"):
        parse_run_row({**LLAMA_405B_PP8, "vpp": 1, "first_stage_layers": 100, "last_stage_layers": 24})


def test_an_unknown_model_name_beside_a_complete_shape_is_a_label():
    shape = {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "vocab_size": 50368}
    config = parse_run_row({"model": "mpt-7b", **shape, "gpu": "a100-sxm4-80gb"})
    assert config.model.name == "mpt-7b" and config.model.num_layers == 32
    with pytest.raises(UnknownEntryError, match="mpt-7b"):
        parse_run_row({"model": "mpt-7b", "num_layers": 32, "gpu": "a100-sxm4-80gb"})  # not a full shape
