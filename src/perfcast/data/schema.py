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
