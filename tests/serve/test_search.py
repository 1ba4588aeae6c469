"""Layout search: enumerate, drop what does not fit, rank by predicted step time or cost."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from perfcast.data.schema import DType
from perfcast.errors import SpecError
from perfcast.features.layouts import LayoutSpace
from perfcast.features.parallel import Recompute
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.cli import app
from perfcast.serve.search import search_layouts

SMALL = LayoutSpace(micro_batches=(1, 4), cp=(1,), vpp=(1, 2), recompute=(Recompute.NONE, Recompute.FULL))


@pytest.fixture(scope="module")
def result():
    return search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=StepPredictor.analytic(), space=SMALL)


def test_ranked_best_first_and_all_fit(result) -> None:
    ranked = result.ranked
    assert len(ranked) == result.n_layouts - result.n_out_of_memory > 0
    assert ranked["step_ms"].is_monotonic_increasing
    assert ranked["rank"].tolist() == list(range(1, len(ranked) + 1))
    assert ranked["fits_memory"].all()
    assert (ranked["tp"] * ranked["pp"] * ranked["dp"] * ranked["cp"] == 8).all()


def test_price_ranks_gpu_types_by_cost() -> None:
    out = search_layouts("gpt3-350m", ["a100-sxm4-80gb", "h100-sxm5-80gb"], 8, 32, predictor=StepPredictor.analytic(),
                         space=SMALL, price_per_gpu_hour=2.0).ranked  # fmt: skip
    assert set(out["gpu"]) == {"a100-sxm4-80gb", "h100-sxm5-80gb"}
    assert out["usd_per_step"].is_monotonic_increasing
    expected = out["step_ms"] / 3.6e6 * 8 * 2.0
    pd.testing.assert_series_equal(out["usd_per_step"], expected, check_names=False)


def test_each_gpu_type_gets_its_own_price() -> None:
    gpus = ["a100-sxm4-80gb", "h100-sxm5-80gb"]
    out = search_layouts("gpt3-350m", gpus, 8, 32, predictor=StepPredictor.analytic(), space=SMALL,
                         price_per_gpu_hour=[1.0, 4.0]).ranked  # fmt: skip
    price = out["gpu"].map(dict(zip(gpus, [1.0, 4.0], strict=True)))
    pd.testing.assert_series_equal(out["usd_per_step"], out["step_ms"] / 3.6e6 * 8 * price, check_names=False)
    assert out["usd_per_step"].is_monotonic_increasing and out["gpu"].iloc[0] == "a100-sxm4-80gb"
    with pytest.raises(SpecError, match="3 prices for 2 GPU types; allowed: one for all, or one per GPU type"):
        search_layouts("gpt3-350m", gpus, 8, 32, predictor=StepPredictor.analytic(), price_per_gpu_hour=[1, 2, 3])
    same = search_layouts("gpt3-350m", gpus, 8, 32, predictor=StepPredictor.analytic(), space=SMALL,
                          price_per_gpu_hour=(np.int64(1), np.float32(4.0))).ranked  # fmt: skip
    pd.testing.assert_series_equal(same["usd_per_step"], out["usd_per_step"])
    with pytest.raises(SpecError, match="h100-sxm5-80gb twice with prices 1 and 9"):
        search_layouts("gpt3-350m", ["h100-sxm5-80gb", "H100-SXM5-80GB"], 8, 32, predictor=StepPredictor.analytic(),
                       price_per_gpu_hour=[1.0, 9.0])  # fmt: skip
    with pytest.raises(SpecError, match="price_per_gpu_hour=True"):
        search_layouts("gpt3-350m", gpus, 8, 32, predictor=StepPredictor.analytic(), price_per_gpu_hour=True)


def test_a_gpu_type_without_the_dtype_is_left_out_beside_one_with_it() -> None:
    analytic = StepPredictor.analytic()
    result = search_layouts("gpt3-350m", ["v100-sxm2-32gb", "a100-sxm4-80gb"], 8, 32, predictor=analytic, space=SMALL)
    assert set(result.ranked["gpu"]) == {"a100-sxm4-80gb"} and len(result.skipped_gpus) == 1
    assert "bf16 is not supported on v100-sxm2-32gb" in result.skipped_gpus[0]
    with pytest.raises(SpecError, match="bf16 is not supported on v100-sxm2-32gb"):  # nothing left to search
        search_layouts("gpt3-350m", ["v100-sxm2-32gb"], 8, 32, predictor=analytic, space=SMALL)


def test_nothing_fits_and_bad_input_are_named() -> None:
    with pytest.raises(SpecError, match="fits in memory"):
        search_layouts("gpt3-175b", ["t4"], 1, 1, predictor=StepPredictor.analytic(), dtype=DType.FP16)
    with pytest.raises(SpecError, match="nope"):
        search_layouts("gpt3-350m", ["nope"], 8, 32, predictor=StepPredictor.analytic())
    with pytest.raises(SpecError, match="price_per_gpu_hour"):
        search_layouts("gpt3-350m", ["t4"], 8, 32, predictor=StepPredictor.analytic(), price_per_gpu_hour=0)


def test_fine_tuning_searches_say_how_they_train() -> None:
    analytic = StepPredictor.analytic()
    full = search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, space=SMALL).ranked
    lora = search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, space=SMALL, finetune="lora",
                          document_tokens=256).ranked  # fmt: skip
    assert (lora["finetune"] == "lora").all() and (lora["document_tokens"] == 256).all()
    assert (lora["lora_rank"] == 16).all() and lora["defaulted_fields"].str.contains("lora_rank").all()  # named
    assert not lora["defaulted_fields"].str.contains("document_tokens").any()
    assert lora["step_ms"].iloc[0] < full["step_ms"].iloc[0]  # no weight gradients, shorter attention
    with pytest.raises(SpecError, match="finetune='qlora' unknown; allowed: full, sft, lora"):
        search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, finetune="qlora")
    with pytest.raises(SpecError, match="lora_rank=8 is set but finetune=full"):
        search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, lora_rank=8)
    with pytest.raises(SpecError, match="document_tokens=4096 exceeds seq_len=2048"):
        search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, document_tokens=4096)
    latent = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
              "vocab_size": 1000, "kv_lora_rank": 64, "q_lora_rank": 96, "qk_nope_head_dim": 32,
              "qk_rope_head_dim": 16, "v_head_dim": 32, "intermediate_size": 1024}  # fmt: skip
    with pytest.raises(SpecError, match="no layout of .* passes the layout rules; the first broke: finetune=lora with"):
        search_layouts(latent, ["a100-sxm4-80gb"], 8, 32, predictor=analytic, finetune="lora")


def test_cli_prints_the_best_and_writes_all(tmp_path) -> None:
    out = tmp_path / "all.csv"
    args = ["search", "gpt3-125m", "--gpu", "a100-sxm4-80gb", "--num-gpus", "4", "--global-batch", "16",
            "--predictor", "analytic", "--top", "3", "-o", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    written = pd.read_csv(out)
    assert written["rank"].iloc[0] == 1 and "layouts" in result.output
    bad = CliRunner().invoke(app, ["search", "gpt3-125m", "--gpu", "nope", "--num-gpus", "4", "--global-batch", "16"])
    assert bad.exit_code == 2 and "nope" in bad.output
    lora = CliRunner().invoke(app, [*args[:-2], "--finetune", "lora", "--document-tokens", "256"])
    assert lora.exit_code == 0, lora.output
    assert "global batch 16, lora rank 16, documents of 256 tokens" in " ".join(lora.output.split())


def test_search_is_bounded_and_says_why_nothing_is_ranked() -> None:
    analytic = StepPredictor.analytic()
    with pytest.raises(SpecError, match="bf16 is not supported on v100-sxm2-32gb"):
        search_layouts("gpt3-350m", ["v100-sxm2-32gb"], 8, 32, predictor=analytic)
    with pytest.raises(SpecError, match="positive finite"):
        search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, price_per_gpu_hour=math.inf)
    with pytest.raises(SpecError, match="max_layouts=5"):
        search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, max_layouts=5)
    once = search_layouts("gpt3-125m", ["a100-sxm4-80gb"], 4, 16, predictor=analytic)
    twice = search_layouts("gpt3-125m", ["a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB"], 4, 16, predictor=analytic)
    assert twice.n_layouts == once.n_layouts and len(twice.ranked) == len(once.ranked)


def test_cli_refuses_a_bad_output_before_searching(tmp_path) -> None:
    args = ["search", "gpt3-125m", "--gpu", "a100-sxm4-80gb", "--num-gpus", "4", "--global-batch", "16",
            "--predictor", "analytic"]  # fmt: skip
    for target in (tmp_path / "x.txt", tmp_path):
        result = CliRunner().invoke(app, [*args, "-o", str(target)])
        assert result.exit_code == 2 and "layouts" not in result.output, result.output


def test_cli_search_plot_is_a_picture(tmp_path) -> None:
    import matplotlib.image

    plot = tmp_path / "search.png"
    args = ["search", "gpt3-125m", "--gpu", "a100-sxm4-80gb", "--gpu", "h100-sxm5-80gb", "--num-gpus", "4",
            "--global-batch", "16", "--predictor", "analytic", "--top", "0", "--plot", str(plot)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert matplotlib.image.imread(plot).shape[0] > 200


def test_layouts_tied_on_the_mfu_floor_rank_by_their_upper_bound() -> None:
    from perfcast.serve.predictors import load_step_predictor

    ranked = search_layouts("llama2-70b", ["h100-sxm5-80gb"], 512, 1024, predictor=load_step_predictor(None)).ranked
    groups = ranked.groupby("step_ms", sort=False)["step_hi_ms"]
    assert (groups.size() > 1).any()  # the shipped default puts several layouts on the Hopper floor
    assert groups.apply(lambda hi: hi.is_monotonic_increasing).all()


def test_a_stated_framework_fills_its_overlaps_and_tries_its_zero_stages() -> None:
    """torchtitan: every layout with data or context parallelism FSDP-sharded (ZeRO-3), its switches
    filled and named; one rank per model shard has nothing to shard. An unknown or JAX framework is
    refused before any work."""
    analytic = StepPredictor.analytic()
    titan = search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, framework="titan").ranked
    assert (titan["framework"] == "torchtitan").all()
    sharded = titan["dp"] * titan["cp"] > 1
    assert (titan["cp"] > 1).any() and sharded.any() and (titan.loc[sharded, "zero_stage"] == 3).all()
    assert (titan.loc[~sharded, "zero_stage"] == 0).all()
    assert set(titan["recompute"]) == {"none", "op-sac", "full"}  # torchtitan's checkpointing modes
    named = titan["defaulted_fields"].str.split(",")
    assert named.map(lambda n: "framework" not in n).all()
    assert named[sharded].map(lambda n: "fsdp_prefetch" in n and "overlap_grad_reduce" in n).all()
    plain = search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic).ranked
    assert "framework" not in plain.columns and set(plain["zero_stage"]) == {0, 1}
    assert plain["defaulted_fields"].str.split(",").map(lambda n: "framework" in n).all()
    mcore = search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, framework="nemo").ranked
    overlapped = mcore[(mcore["tp"] > 1) & mcore["sequence_parallel"]]
    assert (mcore["framework"] == "megatron-core").all() and set(mcore["zero_stage"]) == {0, 1}
    assert set(mcore["recompute"]) == set(plain["recompute"]) == {"none", "selective", "full"}
    assert overlapped["defaulted_fields"].str.contains("tp_comm_overlap").all()
    with pytest.raises(SpecError, match="framework='nope' is not a known framework; allowed: megatron-core"):
        search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, framework="nope")
    with pytest.raises(SpecError, match="JAX/XLA stack"):
        search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, framework="maxtext")
    megatron_modes = LayoutSpace(recompute=(Recompute.NONE, Recompute.SELECTIVE))
    with pytest.raises(SpecError, match="recompute=selective with framework=torchtitan"):
        search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 8, 32, predictor=analytic, framework="titan",
                       space=megatron_modes)  # fmt: skip


def test_cli_search_states_the_framework() -> None:
    args = ["search", "gpt3-125m", "--gpu", "a100-sxm4-80gb", "--num-gpus", "4", "--global-batch", "16",
            "--predictor", "analytic", "--top", "3", "--framework", "fsdp2"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "global batch 16, pytorch-fsdp" in " ".join(result.output.split())
    bad = CliRunner().invoke(app, [*args[:-1], "jax"])
    assert bad.exit_code == 2 and "JAX/XLA stack" in bad.output


def test_fsdp_searches_try_one_replica_per_nvlink_domain() -> None:
    """torchtitan and FSDP rank hybrid-sharded layouts beside fully sharded ones; Megatron does not."""
    analytic = StepPredictor.analytic()
    titan = search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 32, 64, predictor=analytic, framework="torchtitan").ranked
    hybrid = titan[titan["dp_replicate"] > 1]
    assert len(hybrid) and (hybrid["tp"] * hybrid["dp"] * hybrid["cp"] / hybrid["dp_replicate"] == 8).all()
    assert (titan["dp_replicate"] == 1).any()
    mcore = search_layouts("gpt3-350m", ["a100-sxm4-80gb"], 32, 64, predictor=analytic, framework="megatron-core")
    assert (mcore.ranked["dp_replicate"] == 1).all()
