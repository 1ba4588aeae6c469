"""The analytic predictor: roofline and alpha-beta op times, the baseline every learned model must beat.

No learning: op times are physical lower bounds at datasheet peaks
(:mod:`perfcast.features.roofline`); :meth:`StepPredictor.analytic
<perfcast.models.step_predictor.StepPredictor.analytic>` composes them into a step through
the schedule (:mod:`perfcast.models.composer`). It is the estimate the learned models
correct. It gives no interval: its ``*_lo_ms`` and ``*_hi_ms`` are NaN.
:func:`model_flops_per_step` is the model-FLOP count every MFU figure divides by.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfcast.features.collective_features import inter_node_fabrics, nvlink_bridged_flags
from perfcast.features.hardware import HardwareSpec, collective_cluster
from perfcast.features.layer_ops import window_keys
from perfcast.features.model import TransformerSpec
from perfcast.features.ops import COLLECTIVE_OPS, op_kinds
from perfcast.features.parallel import Finetune
from perfcast.features.roofline import MS_PER_S, op_time_ms, roofline_time_s
from perfcast.features.run_config import RunConfig
from perfcast.models.predictor_protocol import OpPrediction

NAME = "analytic"


def model_flops_per_step(config: RunConfig) -> float:
    """Model FLOPs of one step (Narayanan et al. convention, no recomputation).

    ``6 * N_matmul`` per token (:meth:`TransformerSpec.flops_per_token`'s matmul term) plus
    attention as the fused cores of the workload graph run it (:func:`attention_flops_per_token`),
    not the full non-causal term of ``flops_per_token``, which would let the MFU of this
    lower-bound predictor exceed 1 at long sequences. LoRA computes no weight gradients of the
    frozen base: ``2 * N_matmul`` fewer FLOPs per token.
    """
    model = config.model
    span = config.parallel.attention_documents(model.seq_len)[1]
    per_token = 6.0 * model.num_matmul_params + attention_flops_per_token(model, span)
    if config.parallel.finetune is Finetune.LORA:
        per_token -= 2.0 * config.model.num_matmul_params
    return per_token * config.tokens_per_step


def attention_flops_per_token(model: TransformerSpec, span: int) -> float:
    """Forward and backward FLOPs per token of a training step's attention scores and context,
    FLOP/token: ``6 * keys * nh * (d_qk + d_v)`` summed over layers, with each query's keys
    ``span / 2`` on the causal full layers (MTP modules' included) and
    :func:`~perfcast.features.layer_ops.window_keys` on the sliding-window layers; ``span`` is
    the attention length (``document_tokens`` of a packed run, else ``seq_len``)."""
    full_layers = model.num_layers - model.num_window_layers + model.mtp_layers
    windowed = model.num_window_layers * window_keys(model.sliding_window, span) if model.num_window_layers else 0
    keys = full_layers * span / 2 + windowed
    return 6.0 * keys * model.num_heads * (model.qk_head_size + model.v_head_size)


class AnalyticOpPredictor:
    """Op times from the roofline and alpha-beta collectives on catalog clusters (no interval,
    never out of domain): an :class:`~perfcast.models.predictor_protocol.OpPredictor`."""

    name = NAME
    has_interval = False
    flags_out_of_domain = False

    def predict_ops_flagged(self, ops: pd.DataFrame, *, coverage: float = 0.9) -> OpPrediction:
        """:meth:`predict_ops` with every row's out-of-domain flag False."""
        pred, lo, hi = self.predict_ops(ops, coverage=coverage)
        return OpPrediction(pred, lo, hi, np.zeros(len(ops), dtype=bool))

    def predict_ops(self, ops: pd.DataFrame, *, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pred, lo, hi) in ms for checked op-table rows; lo and hi are NaN.

        Each row runs on the catalog cluster of its ``gpu`` with ``n_ranks`` ranks,
        ``ranks_per_node`` per node, the ``inter_node`` fabric (default: the GPU's) and
        ``nvlink_bridged`` (compute rows: one GPU).
        """
        ranks = pd.to_numeric(ops.get("n_ranks"), errors="coerce") if "n_ranks" in ops else None
        rpn = pd.to_numeric(ops.get("ranks_per_node"), errors="coerce") if "ranks_per_node" in ops else None
        out = np.full(len(ops), np.nan)
        keys = pd.DataFrame(
            {
                "gpu": ops["gpu"].astype(str).to_numpy(),
                "n": (ranks.fillna(1).clip(lower=1) if ranks is not None else pd.Series(1, index=ops.index)).to_numpy(),
                "rpn": (rpn.fillna(0) if rpn is not None else pd.Series(0, index=ops.index)).to_numpy(),
                "fabric": inter_node_fabrics(ops),
                "bridged": nvlink_bridged_flags(ops) & np.isin(op_kinds(ops), [o.value for o in COLLECTIVE_OPS]),
            }
        )
        comm = np.isin(op_kinds(ops), [o.value for o in COLLECTIVE_OPS])
        # compute rows need only the GPU (a part without interconnect figures still has a roofline)
        for gpu, positions in keys.loc[~comm].groupby("gpu").indices.items():
            positions = np.flatnonzero(~comm)[positions]
            out[positions] = roofline_time_s(ops.iloc[positions], HardwareSpec.from_name(gpu)) * MS_PER_S
        groups = keys.loc[comm].groupby(["gpu", "n", "rpn", "fabric", "bridged"]).indices.items()
        for (gpu, n, per_node, fab, bridged), positions in groups:
            positions = np.flatnonzero(comm)[positions]
            cluster = collective_cluster(gpu, int(n), int(per_node) or None, fab or None, bridged=bool(bridged))
            rows = ops.iloc[positions].assign(ranks_per_node=cluster.nvlink_domain, n_ranks=int(n))
            out[positions] = op_time_ms(rows, cluster)
        nan = np.full(len(ops), np.nan)
        return out, nan, nan.copy()
