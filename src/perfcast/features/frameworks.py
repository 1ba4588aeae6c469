"""Training frameworks: what each ships by default for the run table's software switches.

A run-table row may name its ``framework`` (:class:`Framework`) and state any of the
switches :data:`~perfcast.data.tables.SOFTWARE_SWITCH_COLUMNS`. A switch the row leaves
unstated takes the framework's shipped default (:func:`framework_fields`), and so does
``zero_stage`` of a data-parallel run. What each switch changes in the composed step is
stated in :mod:`perfcast.features.schedule` and ``docs/frameworks.md``; this module only
says which values a framework starts from.

The defaults, with their sources (``docs/frameworks.md`` has the table):

* ``megatron-core`` (Megatron-LM, NeMo, Megatron-Bridge): the recipes NeMo and
  Megatron-Bridge ship: distributed optimizer (``zero_stage = 1``), ``overlap_grad_reduce``
  and ``overlap_param_gather`` on, TP communication overlap (Transformer Engine
  userbuffers) on wherever it can run (``tp > 1`` with sequence parallelism), no CUDA
  graphs. ``fsdp_prefetch`` is on for ``zero_stage = 3`` rows (Megatron-FSDP overlaps
  its parameter gathers).
* ``megatron-deepspeed``: nothing overlapped, ``zero_stage = 0``; the default of a row
  that names no framework, so such rows predict as before frameworks were a column.
* ``torchtitan``: FSDP2 (``zero_stage = 3``) with its implicit prefetch, the gradient
  reduce-scatter overlapped with backward, ``torch.compile`` on, async TP off; its tensor
  parallelism is sequence-parallel (``sequence_parallel`` of a ``tp > 1`` layout: the plan
  shards the norms over the sequence).
* ``pytorch-fsdp`` (FSDP1/FSDP2 under Composer / llm-foundry, NeMo AutoModel):
  ``FULL_SHARD`` (``zero_stage = 3``) with forward and backward prefetch, the gradient
  reduce-scatter overlapped with backward.
* ``deepspeed``: the library's own defaults: ``zero_optimization.stage = 0``;
  ``overlap_comm`` on only at stage 3 (its dynamic default); stage-3 prefetch on
  (``stage3_prefetch_bucket_size > 0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

from perfcast.errors import SpecError


class Framework(str, Enum):
    """The training framework of a run (the run table's ``framework`` column)."""

    MEGATRON_CORE = "megatron-core"
    MEGATRON_DEEPSPEED = "megatron-deepspeed"
    TORCHTITAN = "torchtitan"
    PYTORCH_FSDP = "pytorch-fsdp"
    DEEPSPEED = "deepspeed"

    @classmethod
    def parse(cls, value: str | Framework) -> Framework:
        """Read a framework from its table spelling or a common alias (:data:`FRAMEWORK_ALIASES`).

        Case, surrounding spaces, ``_`` and inner spaces (read as ``-``) are ignored.

        Raises:
            SpecError: naming the value and the allowed spellings; JAX stacks (MaxText,
                Pax, T5X, Levanter) are refused with a message saying why.
        """
        if isinstance(value, Framework):
            return value
        key = "-".join(str(value).strip().lower().replace("_", "-").split())
        if key in JAX_FRAMEWORKS:
            raise SpecError(
                f"framework={value!r} is a JAX/XLA stack: XLA schedules and overlaps its collectives itself, "
                "which perfcast does not model; allowed: " + ", ".join(f.value for f in cls)
            )
        found = FRAMEWORK_ALIASES.get(key)
        if found is None:
            allowed = ", ".join(f.value for f in cls)
            aliases = ", ".join(sorted(a for a in FRAMEWORK_ALIASES if a not in {f.value for f in cls}))
            raise SpecError(f"framework={value!r} is not a known framework; allowed: {allowed} (or {aliases})")
        return found


FRAMEWORK_ALIASES: dict[str, Framework] = {
    **{f.value: f for f in Framework},
    "mcore": Framework.MEGATRON_CORE,
    "megatron": Framework.MEGATRON_CORE,
    "megatron-lm": Framework.MEGATRON_CORE,
    "megatron-bridge": Framework.MEGATRON_CORE,
    "nemo": Framework.MEGATRON_CORE,
    "nemo-megatron": Framework.MEGATRON_CORE,
    "megatron-ds": Framework.MEGATRON_DEEPSPEED,
    "titan": Framework.TORCHTITAN,
    "fsdp": Framework.PYTORCH_FSDP,
    "fsdp1": Framework.PYTORCH_FSDP,
    "fsdp2": Framework.PYTORCH_FSDP,
    "composer": Framework.PYTORCH_FSDP,
    "llm-foundry": Framework.PYTORCH_FSDP,
    "llmfoundry": Framework.PYTORCH_FSDP,
    "nemo-automodel": Framework.PYTORCH_FSDP,
    "automodel": Framework.PYTORCH_FSDP,
    "ds": Framework.DEEPSPEED,
}
"""Spellings :meth:`Framework.parse` accepts (normalised: lower case, ``-`` for ``_`` and spaces).
Megatron-LM, NeMo and Megatron-Bridge run Megatron-Core; Composer, llm-foundry and NeMo
AutoModel wrap PyTorch FSDP."""

JAX_FRAMEWORKS = frozenset({"maxtext", "pax", "paxml", "praxis", "t5x", "levanter", "jax"})
"""Spellings of JAX training stacks, refused by :meth:`Framework.parse`."""

DEFAULT_FRAMEWORK = Framework.MEGATRON_DEEPSPEED
"""The framework of a row that names none: nothing overlapped, as perfcast composed every
row before frameworks were a column (so the trained step correction stays valid)."""

ATTENTION_KERNELS: dict[Framework, str] = {
    Framework.MEGATRON_CORE: "transformer-engine",
    Framework.TORCHTITAN: "flash-attention-2",
    Framework.PYTORCH_FSDP: "flash-attention-2",
}
"""The attention kernels a framework's recipes run, where they are documented: Megatron-Core
(NeMo, Megatron-Bridge) Transformer Engine's ``DotProductAttention`` (cuDNN fused attention);
torchtitan ``torch.nn.functional.scaled_dot_product_attention``, whose CUDA flash backend is
FlashAttention-2; Composer / llm-foundry (``attn_impl: flash``, the flash-attn 2 package) and
NeMo AutoModel (Hugging Face models under SDPA) FlashAttention-2 as well. Megatron-DeepSpeed
and DeepSpeed run whichever attention their flags pick, so they stay a stack of their own."""


def attention_stack(framework: str | Framework) -> str:
    """The training-stack label whose attention runs alike (:data:`ATTENTION_KERNELS`): the kernel
    family of a framework that has a documented one, else the framework's value; a label no
    spelling of :class:`Framework` reads (``pytorch-eager``) is returned as it is."""
    try:
        parsed = Framework.parse(framework)
    except SpecError:
        return str(framework)
    return ATTENTION_KERNELS.get(parsed, parsed.value)

_ZERO_STAGE = {
    Framework.MEGATRON_CORE: 1,
    Framework.MEGATRON_DEEPSPEED: 0,
    Framework.TORCHTITAN: 3,
    Framework.PYTORCH_FSDP: 3,
    Framework.DEEPSPEED: 0,
}
"""``zero_stage`` each framework ships for a data-parallel run (``dp * cp > 1``)."""


SEARCH_ZERO_STAGES: dict[Framework, tuple[int, ...]] = {
    Framework.MEGATRON_CORE: (0, 1),
    Framework.MEGATRON_DEEPSPEED: (0, 1),
    Framework.TORCHTITAN: (3,),
    Framework.PYTORCH_FSDP: (3,),
    Framework.DEEPSPEED: (0, 1, 2, 3),
}
"""The ZeRO stages a layout search tries per framework where there is something to shard
(``dp * cp > 1``): Megatron's plain and distributed optimizer, FSDP's full sharding (torchtitan's
FSDP2, Composer's and AutoModel's FULL_SHARD), DeepSpeed's four stages."""


SEARCH_REPLICATE: frozenset[Framework] = frozenset({Framework.TORCHTITAN, Framework.PYTORCH_FSDP})
"""Frameworks whose layout search also tries hybrid sharding with one replica per NVLink domain
(``dp_replicate``; FSDP's ``HYBRID_SHARD``, FSDP2's ``dp_replicate x dp_shard`` mesh)."""

SEARCH_RECOMPUTE: dict[Framework, tuple[str, ...]] = {
    Framework.MEGATRON_CORE: ("none", "selective", "full"),
    Framework.MEGATRON_DEEPSPEED: ("none", "selective", "full"),
    Framework.TORCHTITAN: ("none", "op-sac", "full"),
    Framework.PYTORCH_FSDP: ("none", "full"),
    Framework.DEEPSPEED: ("none", "full"),
}
"""The recomputation modes a layout search tries per framework (``recompute`` values): Megatron's
selective and full recomputation; torchtitan's op-level selective checkpointing and full; a
whole-block checkpoint wrapper (Composer's ``activation_checkpointing``, AutoModel's, DeepSpeed's)
for the others."""


def framework_fields(stated: Mapping[str, Any]) -> dict[str, Any]:
    """The layout fields a framework fills: its defaults for the fields ``stated`` lacks.

    Args:
        stated: a row's parallel fields, checked cells by run-table name (``tp``, ``dp``,
            ``cp``, ``sequence_parallel``, ``zero_stage``, ``framework`` and the switches);
            an absent ``framework`` is :data:`DEFAULT_FRAMEWORK`.

    Returns:
        The absent ones of ``zero_stage`` (only for ``dp * cp > 1``), of ``sequence_parallel``
        (torchtitan's, for ``tp > 1``) and of the switches
        ``tp_comm_overlap, overlap_grad_reduce, overlap_param_gather, fsdp_prefetch,
        ep_comm_overlap, cuda_graphs, torch_compile``, with the framework's values.
        ``tp_comm_overlap`` is on only where it can run (``tp > 1`` with ``sequence_parallel``);
        ``ep_comm_overlap`` is off for every framework (opt-in in Megatron-Core).
    """
    framework = Framework.parse(stated.get("framework", DEFAULT_FRAMEWORK))
    tp, dp_cp = int(stated.get("tp", 1)), int(stated.get("dp", 1)) * int(stated.get("cp", 1))
    framework_sp = framework is Framework.TORCHTITAN and tp > 1
    fills: dict[str, Any] = {"sequence_parallel": True} if framework_sp and "sequence_parallel" not in stated else {}
    sp = bool(stated.get("sequence_parallel", framework_sp))
    zero = stated.get("zero_stage")
    if zero is None:
        zero = _ZERO_STAGE[framework] if dp_cp > 1 else 0
        if zero:
            fills["zero_stage"] = zero
    mcore, fsdp = framework is Framework.MEGATRON_CORE, framework in (Framework.TORCHTITAN, Framework.PYTORCH_FSDP)
    deepspeed = framework is Framework.DEEPSPEED
    shipped = {
        "tp_comm_overlap": mcore and tp > 1 and sp,
        "overlap_grad_reduce": mcore or fsdp or (deepspeed and zero == 3),
        "overlap_param_gather": mcore,
        "fsdp_prefetch": mcore or fsdp or deepspeed,
        "ep_comm_overlap": False,
        "cuda_graphs": False,
        "torch_compile": framework is Framework.TORCHTITAN,
    }
    fills.update({name: value for name, value in shipped.items() if name not in stated})
    return fills
