"""Low-precision run dtypes across the feature layer: DType sizes, peaks, fp8_recipe, the
workload graph's per-op dtypes and quantize ops, and the op model's dtype domain."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.data.schema import DType, Fp8Recipe
from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec, HardwareSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.parallel import ParallelConfig
from perfcast.features.run_config import parse_run_row
from perfcast.features.workload import QUANTIZED_GEMMS, build_workload_graph

LOW = ("fp8", "mxfp8", "nvfp4", "mxfp4")


def test_dtype_sizes_include_the_amortised_block_scale():
    assert DType.parse("mxfp8").bytes_per_element == 1 + 1 / 32
    assert DType.parse("nvfp4").bytes_per_element == 0.5 + 1 / 16
    assert DType.parse("mxfp4").bytes_per_element == 0.5 + 1 / 32
    assert DType.FP8.bytes_per_element == 1 and DType.BF16.bytes_per_element == 2
    assert [DType(d).scale_block_size for d in LOW] == [None, 32, 16, 32]
    assert all(DType(d).is_low_precision for d in LOW) and not DType.BF16.is_low_precision


@pytest.mark.parametrize("hw_id", ["b200-hgx", "gb200-per-gpu", "b300-hgx", "gb300-per-gpu"])
def test_blackwell_block_scaled_peaks(hw_id):
    hw = HardwareSpec.from_name(hw_id)
    assert hw.peak_tflops("mxfp8") == hw.peak_fp8_tflops
    assert hw.peak_tflops("nvfp4") == hw.peak_tflops("mxfp4") == hw.peak_fp4_tflops
    assert hw.peak_fp4_tflops > hw.peak_fp8_tflops


@pytest.mark.parametrize("dtype", ["mxfp8", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("hw_id", ["h100-sxm5-80gb", "a100-sxm4-80gb", "mi300x"])
def test_block_scaled_dtypes_refused_without_block_scaled_tensor_cores(hw_id, dtype):
    with pytest.raises(SpecError, match=f"{dtype} is not supported on {hw_id}.*peak_fp4_tflops"):
        HardwareSpec.from_name(hw_id).peak_tflops(dtype)


def test_nvfp4_is_nvidia_only():
    mi355x = HardwareSpec.from_name("mi355x")
    assert mi355x.peak_tflops("mxfp4") == mi355x.peak_fp4_tflops
    with pytest.raises(SpecError, match="nvfp4 is not supported on mi355x.*use mxfp4"):
        mi355x.peak_tflops("nvfp4")


def test_fp8_recipe_defaults_and_checks():
    assert ParallelConfig(global_batch=8, dtype="fp8").scaling_recipe is Fp8Recipe.DELAYED
    assert ParallelConfig(global_batch=8, dtype="mxfp8").scaling_recipe is Fp8Recipe.MXFP8
    assert ParallelConfig(global_batch=8).scaling_recipe is None
    assert ParallelConfig(global_batch=8, dtype="fp8", fp8_recipe=" Tensorwise ").fp8_recipe is Fp8Recipe.TENSORWISE
    assert ParallelConfig(global_batch=8, dtype="fp8", fp8_recipe="rowwise").fp8_recipe is Fp8Recipe.ROWWISE  # torchao
    for fields, message in (
        ({"dtype": "fp8", "fp8_recipe": "perchannel"}, "fp8_recipe='perchannel' is not a known recipe; allowed: tens"),
        ({"dtype": "bf16", "fp8_recipe": "delayed"}, "fp8_recipe=delayed needs dtype fp8 or mxfp8"),
        ({"dtype": "mxfp8", "fp8_recipe": "tensorwise"}, "contradicts dtype=mxfp8"),
        ({"dtype": "fp8", "fp8_recipe": "mxfp8"}, "write dtype=mxfp8"),
    ):
        with pytest.raises(ValueError, match=message):
            ParallelConfig(global_batch=8, **fields)


ROW = dict(num_layers=4, hidden_size=1024, num_heads=8, num_kv_heads=8, ffn_hidden_size=4096, vocab_size=32000,
           seq_len=2048, dp=8, micro_batch=1, global_batch=8, gpu="b200-hgx", num_gpus=8)  # fmt: skip


def test_run_rows_parse_fp8_recipe_and_fold_megatron_mxfp8():
    assert parse_run_row({**ROW, "dtype": "fp8", "fp8_recipe": "blockwise"}).parallel.fp8_recipe is Fp8Recipe.BLOCKWISE
    folded = parse_run_row({**ROW, "dtype": "fp8", "fp8_recipe": "mxfp8"}).parallel
    assert folded.dtype is DType.MXFP8
    with pytest.raises(SpecError, match="fp8_recipe='bogus' is not a known recipe"):
        parse_run_row({**ROW, "dtype": "fp8", "fp8_recipe": "bogus"})
    with pytest.raises(SpecError, match="nvfp4 is not supported on h100-sxm5-80gb"):
        parse_run_row({**ROW, "dtype": "nvfp4", "gpu": "h100-sxm5-80gb"})
    with pytest.raises(SpecError, match="mxfp8 is not supported on h100-sxm5-80gb"):
        parse_run_row({**ROW, "dtype": "fp8", "fp8_recipe": "mxfp8", "gpu": "h100-sxm5-80gb"})


def _graph(dtype: str, **parallel):
    model = TransformerSpec(num_layers=4, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                      seq_len=2048)  # fmt: skip
    p = ParallelConfig(dp=8, global_batch=8, dtype=dtype, **parallel)
    return build_workload_graph(model, p, ClusterSpec.build("b200-hgx", 8)).nodes


@pytest.mark.parametrize("dtype", LOW)
def test_low_precision_graph_quantizes_linear_gemms_only(dtype):
    nodes = _graph(dtype, recompute="full")
    gemm = nodes["op"].isin(["matmul", "bmm", "linear"])
    base = nodes["name"].str.split(".").str[:2].str.join(".")
    quantized = gemm & base.isin(QUANTIZED_GEMMS)
    assert quantized.any() and (nodes.loc[quantized, "dtype"] == dtype).all()
    assert (nodes.loc[~quantized, "dtype"] == "bf16").all()  # attention, head, norms, activations, comms
    assert (nodes.loc[nodes["op"] == "attention", "dtype"] == "bf16").all()
    quant = nodes[nodes["name"].str.contains(".quantize", regex=False)]
    # forward and recompute: activation + weight; backward: the output gradient (dgrad); wgrad none
    present = set(base[gemm])  # this dense model's linear GEMMs (no MoE, MLA or MTP ones)
    assert set(quant["name"]) == {f"{g}{s}.quantize" for g in QUANTIZED_GEMMS if g in present
                                  for s in ("", ".dgrad")} | {f"{g}.quantize.recompute" for g in QUANTIZED_GEMMS
                                                              if g in present}  # fmt: skip
    assert (quant["op"] == "mul").all() and quant["scalar"].all() and (quant["dtype"] == "bf16").all()
    qkv = nodes.set_index("name").loc["attn.qkv"]
    fwd_q = nodes.set_index("name").loc["attn.qkv.quantize"]
    assert (fwd_q["rows"], fwd_q["cols"]) == (qkv["m"] + qkv["n"], qkv["k"])
    dgrad = nodes.set_index("name").loc["attn.qkv.dgrad"]
    bwd_q = nodes.set_index("name").loc["attn.qkv.dgrad.quantize"]
    assert (bwd_q["rows"], bwd_q["cols"]) == (dgrad["m"], dgrad["k"])


def test_sixteen_bit_graph_has_no_quantize_ops():
    nodes = _graph("bf16")
    assert not nodes["name"].str.contains("quantize").any()
    assert (nodes.loc[nodes["op"].isin(["matmul", "attention"]), "dtype"] == "bf16").all()


def test_op_model_flags_unseen_dtypes_and_predicts_them_from_the_roofline():
    from perfcast.serve.predictors import load_op_predictor

    op_model = getattr(load_op_predictor(None), "op_model", None)
    if op_model is None:
        pytest.skip("no default op model shipped in this build")
    ops = pd.DataFrame({"op": "matmul", "m": 8192, "n": 8192, "k": 8192, "gpu": "b200-hgx",
                        "dtype": ["bf16", "fp8", "mxfp8", "nvfp4", "mxfp4"]})  # fmt: skip
    with pytest.warns(Warning):
        pred = op_model.predict(ops)
    ood = op_model.out_of_domain(ops)
    assert np.isfinite(pred).all() and (pred > 0).all()
    assert ood[2:].all()  # block-scaled formats: no training rows
    assert pred[3] < pred[1] < pred[0]  # nvfp4 faster than fp8 faster than bf16
