"""Parameter and FLOP counts of a transformer shape: the derived figures of a model spec.

:class:`ModelCounts` is mixed into :class:`~perfcast.features.model.TransformerSpec`, whose
fields (``num_layers``, ``hidden_size`` ...) and resolved shape (``kv_heads``,
``head_size``, ``ffn_size`` ...) it reads: parameter counts per part and in total,
parameters, and model FLOPs per token. Notation as in :mod:`perfcast.features.model`.
"""

from __future__ import annotations

import operator

from perfcast.errors import SpecError
from perfcast.features.model_parts import NormType, PositionEmbedding


class ModelCounts:
    """Parameter counts (parameters) and FLOPs per token (FLOP/token) of a :class:`TransformerSpec`'s shape."""

    # ------------------------------------------------------------------ parameter counts

    @property
    def _q_width(self) -> int:
        return self.num_heads * self.head_size

    @property
    def _kv_width(self) -> int:
        return self.kv_heads * self.head_size

    @property
    def attention_matmul_params_per_layer(self) -> int:
        """Attention projection weights of one layer, parameters (no biases).

        ``Q: h·(nh·hd)``, ``K, V: h·(nkv·hd)`` each, ``O: (nh·hd)·h``. With ``mla``
        (``r_q, r_kv`` the latent sizes, ``d_n, d_r, d_v`` the head parts):
        ``h·r_q + r_q·nh·(d_n + d_r)`` (or ``h·nh·(d_n + d_r)`` without ``r_q``),
        ``h·(r_kv + d_r) + r_kv·nh·(d_n + d_v)`` and ``O: nh·d_v·h``.
        """
        h, m = self.hidden_size, self.mla
        if m is None:
            return 2 * h * self._q_width + 2 * h * self._kv_width
        q_out = self.num_heads * m.qk_head_dim
        q = h * q_out if m.q_lora_rank is None else m.q_lora_rank * (h + q_out)
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * self.num_heads * (
            m.qk_nope_head_dim + m.v_head_dim
        )
        return q + kv + self.num_heads * m.v_head_dim * h

    @property
    def attention_params_per_layer(self) -> int:
        """Attention parameters of one layer: projection weights plus, with ``bias``, the
        Q, K, V, O biases ``nh·hd + 2·nkv·hd + h``; MLA's latent norms ``r_q + r_kv``; ``nh``
        sink logits with ``attention_sinks``."""
        params = self.attention_matmul_params_per_layer
        if self.bias:
            params += self._q_width + 2 * self._kv_width + self.hidden_size
        if self.mla is not None:
            params += (self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank
        if self.attention_sinks:
            params += self.num_heads
        return params

    def _mlp_weights(self, ffn: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * ffn

    def _mlp_params(self, ffn: int) -> int:
        params = self._mlp_weights(ffn)
        if self.bias:
            params += (2 if self.gated_mlp else 1) * ffn + self.hidden_size
        return params

    @property
    def mlp_params_per_layer(self) -> int:
        """Parameters of one dense MLP: ``3·h·f`` gated or ``2·h·f`` plain, plus biases
        (``2f + h`` gated, ``f + h`` plain) with ``bias``."""
        return self._mlp_params(self.ffn_size)

    @property
    def expert_params(self) -> int:
        """Parameters of one expert MLP (the MLP formula with ``fe`` for ``f``)."""
        return self._mlp_params(self.expert_ffn_size)

    @property
    def router_params_per_layer(self) -> int:
        """Router weights of one MoE layer ``h·E`` (no bias); 0 for a dense model."""
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def shared_expert_params(self) -> int:
        """Parameters of a layer's shared experts (the MLP formula with their inner size); 0 when none."""
        return self._mlp_params(self.shared_expert_ffn_size) if self.num_shared_experts else 0

    @property
    def moe_params_per_layer(self) -> int:
        """Parameters of one MoE block: all ``E`` experts, the shared experts and the router; 0 when dense."""
        if not self.is_moe:
            return 0
        return self.num_experts * self.expert_params + self.shared_expert_params + self.router_params_per_layer

    @property
    def _norm_params(self) -> int:
        h = self.hidden_size
        return 2 * h if self.norm is NormType.LAYERNORM else h

    @property
    def norm_params_per_layer(self) -> int:
        """Parameters of the two norms of one layer: ``2·2h`` layernorm, ``2·h`` rmsnorm."""
        return 2 * self._norm_params

    @property
    def final_norm_params(self) -> int:
        """Parameters of the norm after the last layer: ``2h`` layernorm, ``h`` rmsnorm."""
        return self._norm_params

    @property
    def embedding_params(self) -> int:
        """Input embedding ``V·h`` plus, for learned positions, ``positions·h``."""
        params = self.vocab_size * self.hidden_size
        if self.position_embedding is PositionEmbedding.LEARNED:
            params += self.positions * self.hidden_size
        return params

    @property
    def output_params(self) -> int:
        """LM head weights ``V·h`` (no bias); 0 when tied to the input embedding."""
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    def num_params_per_layer(self, moe: bool = False) -> int:
        """Parameters of one layer: attention, two norms and its MLP (or MoE block).

        Args:
            moe: count an MoE layer (all experts and the router) instead of a dense one.

        Raises:
            SpecError: ``moe=True`` on a dense model.
        """
        if moe and not self.is_moe:
            raise SpecError(f"moe=True but num_experts={self.num_experts}: the model is dense")
        mlp = self.moe_params_per_layer if moe else self.mlp_params_per_layer
        return self.attention_params_per_layer + self.norm_params_per_layer + mlp

    @property
    def num_params(self) -> int:
        """Total parameters: embeddings, all layers, final norm and (untied) LM head; the
        multi-token-prediction modules are apart (:attr:`num_mtp_params`), as model cards count."""
        layers = self.num_dense_layers * self.num_params_per_layer(moe=False)
        if self.is_moe:
            layers += self.num_moe_layers * self.num_params_per_layer(moe=True)
        return self.embedding_params + layers + self.final_norm_params + self.output_params

    @property
    def mtp_proj_params(self) -> int:
        """Parameters of one multi-token-prediction module besides its layer: the ``2h -> h``
        projection and three norms (embedding, hidden state, output); it shares the
        embedding and LM head."""
        return 2 * self.hidden_size**2 + 3 * self._norm_params

    @property
    def num_mtp_params(self) -> int:
        """Parameters of the ``mtp_layers`` modules: each a layer like the last one plus
        :attr:`mtp_proj_params`; 0 without MTP."""
        return self.mtp_layers * (self.num_params_per_layer(moe=self.is_moe) + self.mtp_proj_params)

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: as :attr:`num_params`, but each MoE layer counts only
        ``top_k`` experts (plus the shared experts and the router). Equals :attr:`num_params`
        for a dense model."""
        if not self.is_moe:
            return self.num_params
        inactive = (self.num_experts - self.top_k) * self.expert_params
        return self.num_params - self.num_moe_layers * inactive

    @property
    def num_matmul_params(self) -> int:
        """Weights one token multiplies through, parameters: attention projections, the
        dense MLPs, the ``top_k`` active experts, shared experts and routers of MoE layers,
        and the LM head (counted even when tied); each multi-token-prediction module adds
        its layer, its ``2h -> h`` projection and another LM-head pass. Excludes biases,
        norms and input/position embeddings."""
        per_layer_attn = self.attention_matmul_params_per_layer
        dense = self._mlp_weights(self.ffn_size)
        moe = self.top_k * self._mlp_weights(self.expert_ffn_size) + self.router_params_per_layer
        if self.num_shared_experts:
            moe += self._mlp_weights(self.shared_expert_ffn_size)
        total = (
            self.num_layers * per_layer_attn
            + self.num_dense_layers * dense
            + self.num_moe_layers * moe
            + self.vocab_size * self.hidden_size
        )
        if self.mtp_layers:  # each module: its layer, the 2h -> h projection and an LM-head pass
            mtp_layer = moe if self.is_moe else dense
            total += self.mtp_layers * (
                per_layer_attn + mtp_layer + 2 * self.hidden_size**2 + self.vocab_size * self.hidden_size
            )
        return total

    # ------------------------------------------------------------------ FLOPs

    def flops_per_token(self, seq_len: int | None = None, *, training: bool = True) -> float:
        """Model FLOPs per token of one training (or forward-only) step, FLOP/token.

        The count of Narayanan et al. 2021 ("Efficient large-scale language model training
        on GPU clusters using Megatron-LM"), without activation recomputation (their
        ``96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h))`` per iteration includes one recomputed
        forward pass), generalised to GQA/MQA, gated MLPs and MoE::

            training:  6·N_mm + 12·L·s·(nh·hd)
            forward:   2·N_mm +  4·L·s·(nh·hd)

        ``N_mm`` is :attr:`num_matmul_params`: every matmul weight costs 2 FLOPs per token
        forward and 4 backward (input and weight gradients). The second term is attention
        scores ``QKᵀ`` and context ``AV`` (``2·s·nh·hd`` each per token and layer forward),
        counted, as Megatron does, for full non-causal attention: causal masking is not
        subtracted. In general each layer (MTP modules' included) adds
        ``2·s_l·nh·(d_qk + d_v)`` forward, with ``d_qk, d_v`` the Q/K and V head sizes
        (:attr:`qk_head_size`, :attr:`v_head_size`) and ``s_l = min(sliding_window, s)``
        on the windowed layers, ``s`` on the others. Biases, norms, activations, softmax and
        the optimizer are left out, and
        activation recomputation is not counted (it is a property of the run, not the
        model). For a dense GPT with ``nh·hd = h`` and ``f = 4h`` this is
        ``72·L·h²·(1 + s/(6h) + V/(12·h·L))`` per token.

        Args:
            seq_len: tokens per sequence for the attention term; default :attr:`seq_len`.
            training: forward + backward (True) or forward only (False).

        Raises:
            SpecError: ``seq_len`` not positive.
        """
        s = self.seq_len if seq_len is None else seq_len
        try:
            s = operator.index(s)  # int, numpy integer
        except TypeError:
            s = -1
        if isinstance(seq_len, bool) or s <= 0:
            raise SpecError(f"seq_len={seq_len!r} is not allowed; expected a positive integer")
        window = min(self.sliding_window or s, s)
        full_layers = self.num_layers - self.num_window_layers + self.mtp_layers
        keys = full_layers * s + self.num_window_layers * window  # keys each token attends to, over all layers
        attention = keys * self.num_heads * (self.qk_head_size + self.v_head_size)
        if training:
            return 6.0 * self.num_matmul_params + 6.0 * attention
        return 2.0 * self.num_matmul_params + 2.0 * attention
