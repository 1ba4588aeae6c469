"""The vocabularies of the op and run tables: op names and numeric formats.

These enums are part of the table schemas (DESIGN.md, "Interfaces"): readers validate
records against them, and the features layer gives them their physical meaning.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from perfcast.errors import SpecError

EnumT = TypeVar("EnumT", bound=Enum)


class OpType(str, Enum):
    """The ``op`` column of the op table.

    ``swiglu`` is the fused gated activation ``silu(gate) * up`` of a gated MLP (vLLM's and
    Vidur's ``SiluAndMul``, Megatron-Core's bias-SwiGLU fusion): ``rows x cols`` outputs from
    the two ``rows x cols`` halves of its input, one kernel.
    """

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
    SWIGLU = "swiglu"
    ATTENTION = "attention"
    EMBEDDING = "embedding"
    OPTIMIZER = "optimizer"
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLTOALL = "alltoall"
    SENDRECV = "sendrecv"


class DType(str, Enum):
    """Compute dtype of an op or of a training run (the op and run tables' ``dtype``).

    ``fp8``, ``mxfp8``, ``nvfp4`` and ``mxfp4`` are *low-precision* run dtypes: the linear
    layers' GEMMs run in that format while attention, norms, softmax and activations stay
    bf16 (see ``docs/precisions.md``). The block-scaled formats carry one scale per block
    of :attr:`scale_block_size` elements along the reduction dimension: an 8-bit power of
    two (E8M0) per 32 elements for the MX formats (OCP Microscaling), an fp8 (E4M3) scale
    per 16 elements for NVFP4.
    """

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"

    @property
    def bytes_per_element(self) -> float:
        """Storage per element of tensors in this dtype, bytes, block scales included.

        TF32 is stored as fp32. For the low-precision dtypes this is the GEMM operand
        size (activations between layers stay 16 bit): fp8 1, mxfp8 1 + 1/32, nvfp4
        0.5 + 1/16, mxfp4 0.5 + 1/32 -- the element bits plus the block scale amortised
        over its :attr:`scale_block_size` elements. Whole sizes are ints.
        """
        return _BYTES[self]

    @property
    def scale_block_size(self) -> int | None:
        """Elements sharing one scale factor (block-scaled formats), else ``None``."""
        return _SCALE_BLOCK.get(self)

    @property
    def is_low_precision(self) -> bool:
        """GEMMs of runs in this dtype are quantized; the other ops stay bf16."""
        return self in _LOW_PRECISION

    @classmethod
    def parse(cls, value: str | DType) -> DType:
        """Read a dtype from its table spelling, or a torch name like ``float32``.

        Raises:
            SpecError: naming the value and the allowed spellings.
        """
        if isinstance(value, DType):
            return value
        key = str(value).strip().lower().removeprefix("torch.")
        return parse_member(cls, value, "dtype", "dtype", _ALIASES.get(key, key))


_BYTES: dict[DType, float] = {
    DType.FP32: 4,
    DType.TF32: 4,
    DType.FP16: 2,
    DType.BF16: 2,
    DType.FP8: 1,
    DType.MXFP8: 1 + 1 / 32,
    DType.NVFP4: 0.5 + 1 / 16,
    DType.MXFP4: 0.5 + 1 / 32,
}
_SCALE_BLOCK = {DType.MXFP8: 32, DType.NVFP4: 16, DType.MXFP4: 32}
_LOW_PRECISION = frozenset({DType.FP8, DType.MXFP8, DType.NVFP4, DType.MXFP4})
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
    "mx_fp8": "mxfp8",
    "nv_fp4": "nvfp4",
    "mx_fp4": "mxfp4",
}


class Fp8Recipe(str, Enum):
    """Scaling recipe of an fp8 run (the run table's optional ``fp8_recipe``, Megatron-LM's
    ``--fp8-recipe`` values).

    ``tensorwise``: one scale per tensor from its current amax; ``delayed``: one scale
    per tensor from an amax history (Transformer Engine's default); ``rowwise``: one scale
    per row of each operand (torchao's float8 ``rowwise`` recipe, torchtitan's
    ``float8.recipe_name``); ``blockwise``: one scale per 1x128 / 128x128 block; ``mxfp8``:
    MXFP8 (one E8M0 scale per 32 elements, Blackwell tensor cores), the same as ``dtype=mxfp8``.
    """

    TENSORWISE = "tensorwise"
    DELAYED = "delayed"
    ROWWISE = "rowwise"
    BLOCKWISE = "blockwise"
    MXFP8 = "mxfp8"

    @classmethod
    def default_for(cls, dtype: DType) -> Fp8Recipe | None:
        """The recipe a run in ``dtype`` gets when none is stated (``None``: not an fp8 run)."""
        return {DType.FP8: cls.DELAYED, DType.MXFP8: cls.MXFP8}.get(dtype)

    @classmethod
    def parse(cls, value: str | Fp8Recipe) -> Fp8Recipe:
        """Read a recipe from its table spelling (case and surrounding spaces ignored).

        Raises:
            SpecError: naming the value and the allowed values.
        """
        return parse_member(cls, value, "fp8_recipe", "recipe")


GEMM_OP_NAMES = frozenset({OpType.MATMUL, OpType.BMM, OpType.LINEAR})
COLLECTIVE_OP_NAMES = frozenset(
    {OpType.ALLREDUCE, OpType.ALLGATHER, OpType.REDUCESCATTER, OpType.ALLTOALL, OpType.SENDRECV}
)


def op_row_fields(op: OpType) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The op-table columns a row of ``op`` reads: (whole numbers it must give, whole numbers
    it may give, boolean flags). A GEMM query without ``batch`` is one matrix product."""
    if op in GEMM_OP_NAMES:
        return ("m", "n", "k"), ("batch",), ()
    if op is OpType.ATTENTION:
        return ("batch", "heads", "seq_q", "seq_kv", "head_dim"), ("kv_heads",), ("causal", "backward")
    if op in COLLECTIVE_OP_NAMES:
        return ("bytes", "n_ranks"), ("ranks_per_node",), ("nvlink_bridged",)
    return ("rows", "cols"), (), ("scalar", "backward")


def shape_columns(op: OpType) -> tuple[str, ...]:
    """Op-table columns a measured record of ``op`` must fill with positive numbers."""
    required, optional, _ = op_row_fields(op)
    return (*optional, *required) if op in GEMM_OP_NAMES else required


class TimingScope(str, Enum):
    """What a run record's measured time covers (the ``timing_scope`` column)."""

    STEP = "step"  # one whole training iteration: forward, backward, gradient sync, optimizer
    FWD_BWD = "fwd_bwd"  # forward and backward of one global batch, no optimizer step
    FWD = "fwd"  # forward only (inference)
    TIME_TO_TRAIN = "time_to_train"  # only a whole-run time is known (``measured_ttt_min``)


class OpTiming(str, Enum):
    """How an op record's time was taken, and so what it covers (the op table's ``timing`` column).

    The same op measures 10x apart at the small end depending on the method: a host-launched
    call timed with CUDA events includes the launch and host gap (12-32 us floors on NeuSight's
    GPUs, 14.5 us on perfcast's H200 profile), the summed device time of its kernels does not
    (1-5 us floors in Vidur's tables). Readers set it from each source's documented method.
    """

    GPU_KERNELS = "gpu_kernels"  # summed device durations of the op's kernels (profiler or nsys ranges; Vidur)
    CUDA_EVENTS = "cuda_events"  # CUDA events around each host-launched call: launch and host overhead included
    LOOP_MEAN = "loop_mean"  # one timer around many back-to-back calls over their count: launches overlap kernels
    CPU_OP = "cpu_op"  # host wall time of the call (CPU-only traces)

    @property
    def includes_launch(self) -> bool:
        """The time includes the host launch of the call (idle GPU between calls)."""
        return self in (OpTiming.CUDA_EVENTS, OpTiming.CPU_OP)

    @classmethod
    def parse(cls, value: str | OpTiming) -> OpTiming:
        """Read a timing from its table spelling (case and surrounding spaces ignored).

        Raises:
            SpecError: naming the value and the allowed values.
        """
        return parse_member(cls, value, OP_TIMING_COLUMN, "timing")


OP_TIMING_COLUMN = "timing"
"""Optional op-table column holding an :class:`OpTiming` value."""
QUERY_TIMING = OpTiming.GPU_KERNELS
"""The timing an op query assumes when it names none: its kernels' device time, the time the op
takes inside a training step, where the host launches run ahead of the GPU."""


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
    "num_experts", "top_k", "tp", "pp", "dp", "cp", "ep", "etp", "dp_replicate", "micro_batch", "global_batch", "vpp",
    "zero_stage", "lora_rank", "num_gpus", "gpus_per_node", "nvlink_domain", "first_stage_layers", "last_stage_layers",
    "document_tokens",
)  # fmt: skip
RUN_BOOL_COLUMNS = (
    "sequence_parallel", "gated_mlp", "tied_embeddings", "flash_attention", "overlap_grad_reduce",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "tp_comm_overlap",
    "overlap_param_gather", "fsdp_prefetch", "ep_comm_overlap", "cuda_graphs", "torch_compile",
)  # fmt: skip
RUN_TIME_COLUMNS = ("measured_step_ms", "measured_ttt_min")
"""Measured step time (ms, per global batch) and whole-run time to train (minutes)."""
RECOMPUTE_NAMES = ("none", "selective", "op-sac", "full")
FINETUNE_NAMES = ("full", "sft", "lora")


FIELD_MAX: dict[str, int] = {
    # run table: model shape (elements, tokens)
    "num_layers": 10_000,
    "hidden_size": 2**20,
    "num_heads": 2**16,
    "num_kv_heads": 2**16,
    "head_dim": 2**16,
    "ffn_hidden_size": 2**22,
    "moe_ffn_hidden_size": 2**22,
    "moe_layer_freq": 10_000,
    "num_shared_experts": 2**10,
    "shared_expert_ffn_hidden_size": 2**22,
    "first_dense_layers": 10_000,
    "mtp_layers": 64,
    "sliding_window": 2**24,
    "sliding_window_layers": 10_000,
    "q_lora_rank": 2**20,
    "kv_lora_rank": 2**20,
    "vocab_size": 2**24,
    "seq_len": 2**24,
    "max_position_embeddings": 2**24,
    "num_experts": 2**16,
    "top_k": 2**10,
    # run table: layout (degrees, sequences) and cluster (GPUs)
    "tp": 2**20,
    "pp": 2**20,
    "dp": 2**22,
    "cp": 2**20,
    "ep": 2**20,
    "etp": 2**20,
    "dp_replicate": 2**22,
    "micro_batch": 2**20,
    "global_batch": 2**26,
    "vpp": 2**10,
    "first_stage_layers": 10_000,
    "last_stage_layers": 10_000,
    "zero_stage": 3,
    "lora_rank": 2**16,
    "document_tokens": 2**24,
    "num_gpus": 2**22,
    "gpus_per_node": 2**10,
    "nvlink_domain": 2**12,
    # op table: shapes (elements), collective payload (bytes) and ranks
    "batch": 2**24,
    "m": 2**26,
    "n": 2**26,
    "k": 2**26,
    "rows": 2**34,
    "cols": 2**30,
    "heads": 2**16,
    "kv_heads": 2**16,
    "seq_q": 2**24,
    "seq_kv": 2**24,
    "bytes": 2**50,
    "n_ranks": 2**22,
    "ranks_per_node": 2**10,
}
"""Largest value each whole-number field of the run and op tables accepts.

Far beyond any real model or cluster (a 16M-token sequence, 4M GPUs, a 1 PiB
collective), yet small enough that products of fields stay finite in float64: a value
above its limit is one row's error, never an overflow.
"""


FIELD_MIN_ZERO = frozenset({"zero_stage", "lora_rank"})
"""Whole-number fields where 0 is allowed; every other one starts at 1."""


def check_whole_number(name: str, value: object) -> int:
    """``value`` as an int if it is a whole number within field ``name``'s range
    (from 1, or 0 for :data:`FIELD_MIN_ZERO`, to :data:`FIELD_MAX`).

    Raises:
        SpecError: naming the field, the value and the allowed range (NaN, inf, text and
            fractions included).
    """
    minimum, maximum = (0 if name in FIELD_MIN_ZERO else 1), FIELD_MAX[name]
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond float range
        number = float("inf") if int(value) > 0 else float("-inf")  # type: ignore[call-overload]
    except (TypeError, ValueError):
        number = float("nan")
    shown = short_repr(value)
    if number in (float("inf"), float("-inf")) and isinstance(value, int):
        raise SpecError(f"{name}={shown} is out of range; allowed: {minimum}..{maximum}")
    if not number.is_integer():
        raise SpecError(f"{name}={shown} is not a whole number; allowed: {minimum}..{maximum}")
    if not minimum <= number <= maximum:
        raise SpecError(f"{name}={shown} is out of range; allowed: {minimum}..{maximum}")
    return int(number)


def parse_member(kind: type[EnumT], value: object, field: str, noun: str, key: str | None = None) -> EnumT:
    """The member of the str-valued enum ``kind`` that field ``field``'s cell ``value`` spells.

    ``value`` is matched as given if already a member, else by ``key`` (default: its text with
    case and surrounding spaces ignored).

    Raises:
        SpecError: ``"<field>=<value> is not a known <noun>; allowed: <values>"``.
    """
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value).strip().lower() if key is None else key)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise SpecError(f"{field}={short_repr(value)} is not a known {noun}; allowed: {allowed}") from None


def short_repr(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages that quote input."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


TRUE_WORDS = frozenset({"1", "1.0", "true", "yes", "y", "t"})
FALSE_WORDS = frozenset({"0", "0.0", "false", "no", "n", "f"})


def parse_flag(name: str, value: object) -> bool:
    """A boolean cell of field ``name``: a bool, 0/1, or true/false, yes/no, t/f, y/n (any case).

    Raises:
        SpecError: naming the field and the value, for anything else.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS | FALSE_WORDS:
        return text in TRUE_WORDS
    raise SpecError(f"{name}={short_repr(value)} is not a boolean; use true/false")
