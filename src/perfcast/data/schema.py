"""The vocabularies of the op and run tables: op names and numeric formats.

These enums are part of the table schemas (DESIGN.md, "Interfaces"): readers validate
records against them, and the features layer gives them their physical meaning.
"""

from __future__ import annotations

from enum import Enum

from perfcast.errors import SpecError


class OpType(str, Enum):
    """The ``op`` column of the op table."""

    MATMUL = "matmul"
    BMM = "bmm"
    LINEAR = "linear"
    SOFTMAX = "softmax"
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"
    ADD = "add"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    RELU = "relu"
    GELU = "gelu"
    SILU = "silu"
    TANH = "tanh"
    ATTENTION = "attention"
    EMBEDDING = "embedding"
    OPTIMIZER = "optimizer"
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLTOALL = "alltoall"
    SENDRECV = "sendrecv"


class DType(str, Enum):
    """Compute dtype of an op or of a training run (the op and run tables' ``dtype``)."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"

    @property
    def bytes_per_element(self) -> int:
        """Storage size of one element of tensors in this dtype, bytes.

        TF32 is stored as fp32. FP8 runs keep activations in 16 bits between
        layers but GEMM operands are 1 byte; this is the GEMM operand size.
        """
        return _BYTES[self]

    @classmethod
    def parse(cls, value: str | DType) -> DType:
        """Read a dtype from its table spelling, or a torch name like ``float32``.

        Raises:
            SpecError: naming the value and the allowed spellings.
        """
        if isinstance(value, DType):
            return value
        key = str(value).strip().lower().removeprefix("torch.")
        key = _ALIASES.get(key, key)
        try:
            return cls(key)
        except ValueError:
            allowed = ", ".join(d.value for d in cls)
            raise SpecError(f"dtype={value!r} is not a known dtype; allowed: {allowed}") from None


_BYTES = {DType.FP32: 4, DType.TF32: 4, DType.FP16: 2, DType.BF16: 2, DType.FP8: 1}
_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "e4m3": "fp8",
}


GEMM_OP_NAMES = frozenset({OpType.MATMUL, OpType.BMM, OpType.LINEAR})
COLLECTIVE_OP_NAMES = frozenset(
    {OpType.ALLREDUCE, OpType.ALLGATHER, OpType.REDUCESCATTER, OpType.ALLTOALL, OpType.SENDRECV}
)


def shape_columns(op: OpType) -> tuple[str, ...]:
    """Op-table columns a row of ``op`` must fill with positive numbers."""
    if op in GEMM_OP_NAMES:
        return ("batch", "m", "n", "k")
    if op is OpType.ATTENTION:
        return ("batch", "heads", "seq_q", "seq_kv", "head_dim")
    if op in COLLECTIVE_OP_NAMES:
        return ("bytes", "n_ranks")
    return ("rows", "cols")


class TimingScope(str, Enum):
    """What a run record's measured time covers (the ``timing_scope`` column)."""

    STEP = "step"  # one whole training iteration: forward, backward, gradient sync, optimizer
    FWD_BWD = "fwd_bwd"  # forward and backward of one global batch, no optimizer step
    FWD = "fwd"  # forward only (inference)
    TIME_TO_TRAIN = "time_to_train"  # only a whole-run time is known (``measured_ttt_min``)


OP_RECORD_REQUIRED = ("op", "dtype", "gpu", "measured_ms", "source")
"""Columns every op record has. ``gpu`` is a catalog id (or ``cpu`` for host runs)."""

OP_INT_COLUMNS = (
    "batch", "m", "n", "k", "rows", "cols", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim",
    "bytes", "n_ranks", "ranks_per_node", "n_repeats",
)  # fmt: skip
OP_BOOL_COLUMNS = ("scalar", "causal", "backward", "nvlink_bridged")
OP_TIME_COLUMNS = ("measured_ms", "measured_min_ms", "measured_max_ms", "measured_std_ms")
"""Measured op times, ms: the statistic the source reports (median or mean of the fastest
runs, see the dataset card), and, where known, its min, max and standard deviation."""

RUN_RECORD_REQUIRED = (
    "num_layers", "hidden_size", "num_heads", "vocab_size", "seq_len", "tp", "pp", "dp", "micro_batch",
    "global_batch", "dtype", "gpu", "num_gpus", "timing_scope", "source",
)  # fmt: skip
"""Columns every run record has; ``measured_step_ms`` or ``measured_ttt_min`` holds its time."""

RUN_INT_COLUMNS = (
    "num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size", "seq_len",
    "num_experts", "top_k", "tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch", "vpp", "zero_stage",
    "lora_rank", "num_gpus", "gpus_per_node",
)  # fmt: skip
RUN_BOOL_COLUMNS = ("sequence_parallel", "gated_mlp", "tied_embeddings", "flash_attention", "overlap_grad_reduce")
RUN_TIME_COLUMNS = ("measured_step_ms", "measured_ttt_min")
"""Measured step time (ms, per global batch) and whole-run time to train (minutes)."""
RECOMPUTE_NAMES = ("none", "selective", "full")
FINETUNE_NAMES = ("full", "lora")
