"""Readers of NeuSight's measured kernel, per-operator and end-to-end latencies.

Source: repo ``sitar-lab/NeuSight`` at commit ``6945927d`` (the data of the ASPLOS'25
NeuSight paper), extracted into ``../shared/data`` (README section 1):

* ``neusight_kernels_gemm.csv.gz``: single fp32 ``torch.bmm`` / ``nn.Linear`` calls
  (:func:`read_neusight_gemm`);
* ``neusight_kernels_vector.csv.gz``: single fp32 element-wise, softmax and LayerNorm
  calls on a ``[rows_B, cols_H]`` tensor (:func:`read_neusight_vector`);
* ``neusight_model_op_latency.csv.gz``: every torch.fx node of 1-layer HuggingFace
  transformers, timed on its own forward and backward (:func:`read_neusight_model_ops`);
* ``neusight_e2e_latency.csv``: whole-model forward (inference) or forward + backward
  (training) latency (:func:`read_neusight_e2e`).

The readers live in :mod:`~perfcast.data.readers.neusight_kernels`,
:mod:`~perfcast.data.readers.neusight_model_ops` and :mod:`~perfcast.data.readers.neusight_e2e`;
this module is the name the source registry (:mod:`perfcast.data.sources`) loads them by,
and what follows holds for all of them.

**Time statistic.** Kernels and fx nodes: one op run 25 times, timed with CUDA events,
``measured_ms`` is the **mean of the 5 fastest runs**, in ms, unchanged (no unit
conversion). It is host-launched single-op timing, so small ops include the launch
overhead (about 0.01-0.03 ms). ``n_repeats`` = 25 records the number of runs. Whole
models on one GPU: the same statistic over 25 runs; 4-GPU runs: mean of the 10 fastest
of 50 steps on rank 0, ms.

Assumptions and mappings:

* ``dtype``: the source's ``float32`` is ``fp32``. NeuSight ran with TF32 off (cuDNN TF32
  disabled; the GEMM kernel names show plain fp32 ``sgemm``/``ffma``/rocBLAS ``SB``).
* ``gpu``: the kernel files print the torch device name, kept as is. The model-op and
  e2e files name the GPU by NeuSight's label directory, which is the torch device name
  with spaces replaced by ``_`` (``NVIDIA_A100_80GB_PCIe``); we restore the spaces
  (``NVIDIA A100 80GB PCIe``) and keep the directory in ``source``. NeuSight's
  ``AMD_Instinct_MI250`` becomes ``AMD Instinct MI250``, which the catalog does not know
  (it has MI250X only): those rows are rejected at GPU resolution rather than guessed.
* GEMM view: the file's ``gemm_*`` columns are already the standard view (output
  ``batch x m x n``, reduction ``k``); ``linear`` carries a bias.
* Backward records (``backward=True``) keep the forward op's shapes; the time is the
  node's whole backward (for a linear: both the data- and the weight-gradient GEMMs).
* ``split`` is NeuSight's own train/test split (``neusight_split``): its test split holds
  larger, out-of-distribution shapes and is the natural held-out set.
* End-to-end runs: see :func:`read_neusight_e2e` (BERT is an encoder, not a causal
  decoder; Switch Transformer is an encoder-decoder MoE).
"""

from perfcast.data.readers.neusight_e2e import read_neusight_e2e
from perfcast.data.readers.neusight_kernels import read_neusight_gemm, read_neusight_vector
from perfcast.data.readers.neusight_model_ops import map_fx_node, read_neusight_model_ops

__all__ = ["map_fx_node", "read_neusight_e2e", "read_neusight_gemm", "read_neusight_model_ops", "read_neusight_vector"]
