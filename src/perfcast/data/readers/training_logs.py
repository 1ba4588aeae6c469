"""Readers of Megatron-LM and NeMo training logs into run records (``timing_scope = step``).

**Megatron-LM** (``pretrain_gpt.py`` stdout): the arguments block that
``megatron/training/arguments.py::_print_args`` prints,

    ------------------------ arguments ------------------------
      num_layers ...................................... 24
    -------------------- end of arguments ---------------------

the ``> padded vocab (size: 50257) with 175 dummy tokens (new size: 50432)`` line, and the
iteration lines ``iteration 100/1000 | ... | elapsed time per iteration (ms): 1234.5 |
... | global batch size: 128 | ...``. Each iteration line reports the mean time per
iteration over the last ``log_interval`` iterations, ms. A log holding several runs
(restarts) is read from its last arguments block on.

**NeMo** (Megatron GPT, NeMo 1.x): the config dump Hydra prints after ``Experiment
configuration`` (a YAML mapping with ``trainer:`` and ``model:``; parsed by a small
indentation parser, PyYAML is not a dependency), the ``Padded vocab_size: 50304, original
vocab_size: 50257`` line, and step times either from progress-bar entries
``train_step_timing in s=1.23`` (seconds per step; repeated refreshes of the same
``global_step`` count once, the last value kept) or from MLPerf ``:::MLLOG`` lines with
``"key": "tracked_stats"`` whose value holds ``train_step_time`` (seconds).

**Step time.** ``measured_step_ms`` is the median of the logged step times after dropping
the first ``skip_first`` logged values (warm-up: compilation, allocator growth, NCCL
setup); ``n_iterations`` says how many logged values were used and
``measured_step_std_ms`` their standard deviation (ddof=1; NaN for one value). For
Megatron each value is already a mean over ``log_interval`` iterations (kept as a column;
empty for NeMo, whose values are single steps).

**Mapping.** Megatron arguments -> run columns: ``num_attention_heads`` -> ``num_heads``;
``num_query_groups`` when ``group_query_attention`` else ``num_heads`` -> ``num_kv_heads``;
``ffn_hidden_size`` (Megatron's defaults when None: 4h, or the SwiGLU ``int(8h/3/64)*64``);
the padded vocab line, else ``padded_vocab_size``, else ``vocab_size`` -> ``vocab_size``;
``seq_length`` -> ``seq_len``; tensor/pipeline/context/expert model parallel sizes -> ``tp,
pp, cp, ep`` (cp, ep default 1); ``world_size`` -> ``num_gpus`` and ``dp = world_size /
(tp*pp*cp)``; ``virtual_pipeline_model_parallel_size``, else ``num_layers / pp /
num_layers_per_virtual_pipeline_stage``, else 1 -> ``vpp``; ``use_distributed_optimizer``
-> ``zero_stage`` 1 (else 0); ``recompute_granularity`` full|selective (None -> none;
legacy ``checkpoint_activations`` -> full); ``fp8`` set -> fp8, else ``bf16`` -> bf16, else
``fp16`` -> fp16, else fp32; ``swiglu`` -> ``gated_mlp``; ``use_flash_attn`` or an
``attention_backend`` of flash/fused/auto -> ``flash_attention`` (fused attention kernels,
no materialised score matrix); ``untie_embeddings_and_output_weights`` -> not
``tied_embeddings``; ``num_experts``, ``moe_router_topk`` -> ``num_experts, top_k``.
NeMo keys map the same way (``model.encoder_seq_length`` -> ``seq_len``,
``trainer.devices * trainer.num_nodes`` -> ``num_gpus``, ``trainer.devices`` ->
``gpus_per_node``, ``model.activations_checkpoint_granularity`` -> ``recompute``,
``model.optim.name`` containing ``distributed`` -> ``zero_stage`` 1, ``trainer.precision``
16/bf16 (-mixed) -> fp16/bf16, ``model.fp8`` -> fp8, ``model.activation`` containing
``swiglu`` -> ``gated_mlp``, ``model.use_flash_attention`` -> ``flash_attention``).
``gpu`` is the given device name (logs do not print it reliably); ``gpus_per_node`` is
capped at ``num_gpus``; ``finetune = "full"``, ``lora_rank = 0``.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.records import REASON_COLUMN, ReadResult
from perfcast.data.tables import RUN_COLUMNS, RUN_MEASURED_COLUMN
from perfcast.errors import DatasetError

logger = logging.getLogger(__name__)

DEFAULT_SKIP_FIRST = 3
"""Logged step times dropped at the start of a run (warm-up)."""

EXTRA_RUN_COLUMNS: tuple[str, ...] = ("num_experts", "top_k", "gated_mlp", "tied_embeddings", "flash_attention")
PROVENANCE_COLUMNS: tuple[str, ...] = (
    "timing_scope",
    RUN_MEASURED_COLUMN,
    "measured_step_std_ms",
    "n_iterations",
    "log_interval",
    "framework",
    "source",
)
RECORD_COLUMNS: tuple[str, ...] = (*RUN_COLUMNS, *EXTRA_RUN_COLUMNS, *PROVENANCE_COLUMNS)
"""Columns of the run record both readers return, in order."""

_ARGS_START = re.compile(r"-{3,}\s*arguments\s*-{3,}")
_ARGS_END = re.compile(r"-{3,}\s*end of arguments\s*-{3,}")
_ARG_LINE = re.compile(r"^\s*(?:\[[^\]]*\]:?\s*)?([A-Za-z_]\w*) (\.*) ?(.*?)\s*$")
_ITER_LINE = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_ITER_MS = re.compile(r"elapsed time per iteration \(ms\):\s*([-+0-9.eE]+|nan|inf)")
_ITER_GBS = re.compile(r"global batch size:\s*(\d+)")
_MEGATRON_VOCAB = re.compile(r"padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")
_NEMO_VOCAB = re.compile(r"Padded vocab_size:\s*(\d+)")
_NEMO_STEP = re.compile(r"train_step_timing in s=([-+0-9.eE]+)")
_NEMO_GLOBAL_STEP = re.compile(r"global_step=([0-9.]+)")
_MLLOG = re.compile(r":::MLLOG\s+(\{.*\})")


# --------------------------------------------------------------------------- shared


def _read_text(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"no such file: {path}")
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from exc


def _scalar(text: str) -> object:
    """A printed value as None/bool/int/float/str."""
    value = text.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    low = value.lower()
    if low in ("none", "null", "~", ""):
        return None
    if low == "true":
        return True
    if low == "false":
        return False
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        return value
    return number if math.isfinite(number) else value


def _int(value: object) -> int | None:
    """A positive whole number, or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        value = _scalar(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _flag(value: object) -> bool:
    if isinstance(value, str):
        value = _scalar(value)
    return bool(value) if isinstance(value, bool | int | float) else False


def _step_stats(times_ms: list[float], skip_first: int, path: str | Path) -> tuple[float, float, int]:
    """(median, std, n) of the step times after dropping the first ``skip_first``."""
    if skip_first < 0:
        raise DatasetError(f"skip_first={skip_first} must be >= 0")
    if not times_ms:
        raise DatasetError(f"{path}: no step times found in the log")
    used = [t for t in times_ms[skip_first:] if math.isfinite(t) and t > 0]
    if not used:
        raise DatasetError(
            f"{path}: {len(times_ms)} logged step time(s), none left after skip_first={skip_first}; lower skip_first"
        )
    arr = np.asarray(used, dtype=float)
    std = float(arr.std(ddof=1)) if len(arr) > 1 else float("nan")
    return float(np.median(arr)), std, len(arr)


def _record(fields: dict[str, object]) -> pd.DataFrame:
    return pd.DataFrame([{c: fields.get(c) for c in RECORD_COLUMNS}], columns=list(RECORD_COLUMNS))


def _layout(fields: dict, num_gpus: int, gpus_per_node: int, path: str | Path) -> None:
    """Fill dp and gpus_per_node; raise when tp*pp*cp does not divide the GPU count."""
    model_parallel = fields["tp"] * fields["pp"] * fields["cp"]
    if num_gpus % model_parallel:
        raise DatasetError(
            f"{path}: world size {num_gpus} is not a multiple of tp*pp*cp = "
            f"{fields['tp']}*{fields['pp']}*{fields['cp']}"
        )
    fields["dp"] = num_gpus // model_parallel
    fields["num_gpus"] = num_gpus
    fields["gpus_per_node"] = min(gpus_per_node, num_gpus)


# --------------------------------------------------------------------------- Megatron-LM


def parse_megatron_arguments(text: str) -> dict[str, object]:
    """The last ``arguments`` block of a Megatron-LM log as {name: value} (empty when absent)."""
    args: dict[str, object] = {}
    inside = False
    for line in text.splitlines():
        if _ARGS_END.search(line):
            inside = False
        elif _ARGS_START.search(line):
            inside, args = True, {}
        elif inside:
            match = _ARG_LINE.match(line)
            if match:
                args[match.group(1)] = _scalar(match.group(3))
    return args


def _megatron_iterations(text: str, global_batch: int | None) -> list[float]:
    """Elapsed ms per iteration of each iteration line (after the last arguments block)."""
    starts = [m.end() for m in _ARGS_START.finditer(text)]
    times = []
    for line in text[starts[-1] if starts else 0 :].splitlines():
        if not _ITER_LINE.search(line):
            continue
        ms = _ITER_MS.search(line)
        if ms is None:
            continue
        gbs = _ITER_GBS.search(line)
        if gbs and global_batch is not None and int(gbs.group(1)) != global_batch:
            continue  # batch-size ramp-up: not the configured global batch
        try:
            times.append(float(ms.group(1)))
        except ValueError:
            continue
    return times


def _megatron_vocab(text: str, args: dict) -> int | None:
    padded = _MEGATRON_VOCAB.findall(text)
    if padded:
        return int(padded[-1][2])
    return _int(args.get("padded_vocab_size")) or _int(args.get("vocab_size"))


def _megatron_recompute(args: dict) -> str:
    granularity = args.get("recompute_granularity")
    if isinstance(granularity, str) and granularity.lower() in ("full", "selective"):
        return granularity.lower()
    if _flag(args.get("checkpoint_activations")):
        return "full"
    return "none"


def _megatron_dtype(args: dict) -> str:
    fp8 = args.get("fp8")
    if fp8 not in (None, False, "None"):
        return "fp8"
    if _flag(args.get("bf16")):
        return "bf16"
    if _flag(args.get("fp16")):
        return "fp16"
    return "fp32"


def _flash(args: dict) -> bool:
    backend = str(args.get("attention_backend") or "").lower()
    return _flag(args.get("use_flash_attn")) or any(k in backend for k in ("flash", "fused", "auto"))


_MEGATRON_REQUIRED = {
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_heads": "num_attention_heads",
    "seq_len": "seq_length",
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "micro_batch": "micro_batch_size",
    "global_batch": "global_batch_size",
    "num_gpus": "world_size",
}


def read_megatron_log(
    path: str | Path, *, gpu: str, gpus_per_node: int = 8, skip_first: int = DEFAULT_SKIP_FIRST
) -> ReadResult:
    """Read a Megatron-LM training log into one run record.

    Args:
        path: the log (stdout of ``pretrain_gpt.py`` or similar).
        gpu: the device name, as printed (``"NVIDIA H100 80GB HBM3"``) or a catalog id.
        gpus_per_node: GPUs per node of the cluster (capped at the world size).
        skip_first: logged iteration lines dropped as warm-up.

    Returns:
        ``records``: one row, :data:`RECORD_COLUMNS` (mapping in the module docstring);
        ``rejected``: empty (a log is one run: what cannot be read raises).

    Raises:
        DatasetError: the file is missing; the arguments block lacks required arguments
            (all named) or the vocabulary size; world size is not a multiple of tp*pp*cp;
            there are no iteration lines, or none left after ``skip_first``.
    """
    text = _read_text(path)
    args = parse_megatron_arguments(text)
    if not args:
        raise DatasetError(f"{path}: no Megatron-LM arguments block ('--- arguments ---') found")
    fields: dict[str, object] = {key: _int(args.get(name)) for key, name in _MEGATRON_REQUIRED.items()}
    missing = [_MEGATRON_REQUIRED[k] for k, v in fields.items() if v is None]
    fields["vocab_size"] = _megatron_vocab(text, args)
    if fields["vocab_size"] is None:
        missing.append("vocab size (padded_vocab_size, vocab_size or the '> padded vocab' line)")
    if missing:
        raise DatasetError(f"{path}: missing or invalid Megatron-LM argument(s): {', '.join(missing)}")
    times = _megatron_iterations(text, fields["global_batch"])  # type: ignore[arg-type]
    if not times:
        raise DatasetError(f"{path}: no 'iteration ... elapsed time per iteration (ms)' lines")
    median, std, n = _step_stats(times, skip_first, path)
    hidden, heads, layers = fields["hidden_size"], fields["num_heads"], fields["num_layers"]
    gated = _flag(args.get("swiglu"))
    ffn = _int(args.get("ffn_hidden_size")) or (int(4 * hidden * 2 / 3 / 64) * 64 if gated else 4 * hidden)
    groups = _int(args.get("num_query_groups")) if _flag(args.get("group_query_attention")) else None
    fields.update(
        num_kv_heads=groups or heads,
        ffn_hidden_size=ffn,
        cp=_int(args.get("context_parallel_size")) or 1,
        ep=_int(args.get("expert_model_parallel_size")) or 1,
        vpp=_megatron_vpp(args, layers, fields["pp"]),
        sequence_parallel=_flag(args.get("sequence_parallel")),
        zero_stage=1 if _flag(args.get("use_distributed_optimizer")) else 0,
        recompute=_megatron_recompute(args),
        finetune="full",
        lora_rank=0,
        dtype=_megatron_dtype(args),
        gpu=gpu,
        num_experts=_int(args.get("num_experts")),
        gated_mlp=gated,
        tied_embeddings=not _flag(args.get("untie_embeddings_and_output_weights")),
        flash_attention=_flash(args),
        timing_scope="step",
        measured_step_std_ms=std,
        n_iterations=n,
        log_interval=_int(args.get("log_interval")),
        framework="megatron-lm",
        source=f"megatron_log:{Path(path).name}",
    )
    fields[RUN_MEASURED_COLUMN] = median
    fields["top_k"] = _int(args.get("moe_router_topk")) if fields["num_experts"] else None
    _layout(fields, fields["num_gpus"], gpus_per_node, path)  # type: ignore[arg-type]
    return ReadResult(records=_record(fields), rejected=pd.DataFrame(columns=[REASON_COLUMN]))


def _megatron_vpp(args: dict, layers: int, pp: int) -> int:
    vpp = _int(args.get("virtual_pipeline_model_parallel_size"))
    if vpp:
        return vpp
    per_stage = _int(args.get("num_layers_per_virtual_pipeline_stage"))
    if per_stage and layers % (pp * per_stage) == 0:
        return layers // pp // per_stage
    return 1


# --------------------------------------------------------------------------- NeMo


def parse_simple_yaml(lines: list[str]) -> dict[str, object]:
    """Parse the block-mapping subset of YAML that OmegaConf prints (``key: value`` nested
    by indentation). List items and flow collections are kept as raw strings or skipped;
    comments after `` #`` are dropped. Enough for NeMo's config dump; not a YAML parser."""
    root: dict[str, object] = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    for raw in lines:
        line = raw.split(" #", 1)[0].rstrip()
        stripped = line.lstrip()
        if not stripped or stripped.startswith(("#", "- ")) or stripped == "-":
            continue
        match = re.match(r"^([\w.\-/]+):(?:\s+(.*))?$", stripped)
        if match is None:
            continue
        indent = len(line) - len(stripped)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not stack:
            stack = [(-1, root)]
        parent = stack[-1][1]
        key, value = match.group(1), match.group(2)
        if value is None or value == "":
            child: dict[str, object] = {}
            parent[key] = child
            stack.append((indent, child))
        else:
            parent[key] = _scalar(value)
    return root


def _nemo_config_lines(text: str) -> list[str]:
    """The lines of the config dump: from the first ``trainer:`` line's block, widened to the
    contiguous indented run of YAML-looking lines around it."""
    lines = text.splitlines()
    anchor = next((i for i, ln in enumerate(lines) if re.match(r"^\s*trainer:\s*$", ln)), None)
    if anchor is None:
        return []
    base = len(lines[anchor]) - len(lines[anchor].lstrip())

    def in_block(ln: str) -> bool:
        if not ln.strip():
            return True
        indent = len(ln) - len(ln.lstrip())
        return indent >= base and bool(re.match(r"^\s*([\w.\-/]+:|- |-$)", ln))

    first = anchor
    while first > 0 and in_block(lines[first - 1]):
        first -= 1
    last = anchor
    while last + 1 < len(lines) and in_block(lines[last + 1]):
        last += 1
    return [ln[base:] if len(ln) >= base else ln for ln in lines[first : last + 1]]


_INTERPOLATION = re.compile(r"^\$\{([\w.]+)\}$")


def _get(cfg: dict, dotted: str, _depth: int = 0) -> object:
    """The value at a dotted key, following simple ``${other.key}`` interpolations."""
    node: object = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    if isinstance(node, str) and _depth < 8:
        match = _INTERPOLATION.match(node)
        if match:
            return _get(cfg, match.group(1), _depth + 1)
    return node


def _nemo_step_times(text: str) -> list[float]:
    """Step times, ms: MLLOG tracked_stats if any, else the progress-bar train_step_timing."""
    mllog = []
    for match in _MLLOG.finditer(text):
        try:
            entry = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("key") == "tracked_stats":
            value = _find_key(entry.get("value"), "train_step_time")
            if isinstance(value, int | float) and not isinstance(value, bool):
                mllog.append(float(value) * 1000.0)
    if mllog:
        return mllog
    by_step: dict[float, float] = {}
    unnumbered: list[float] = []
    for segment in re.split(r"[\r\n]", text):
        for match in _NEMO_STEP.finditer(segment):
            try:
                value = float(match.group(1)) * 1000.0
            except ValueError:
                continue
            step = _NEMO_GLOBAL_STEP.search(segment)
            if step:
                by_step[float(step.group(1))] = value
            else:
                unnumbered.append(value)
    return [by_step[k] for k in sorted(by_step)] if by_step else unnumbered


def _find_key(node: object, key: str) -> object:
    if isinstance(node, dict):
        if key in node:
            return node[key]
        for child in node.values():
            found = _find_key(child, key)
            if found is not None:
                return found
    return None


def _nemo_dtype(cfg: dict) -> str:
    if _flag(_get(cfg, "model.fp8")):
        return "fp8"
    precision = next((p for p in (_get(cfg, "trainer.precision"), _get(cfg, "precision")) if p is not None), 32)
    text = str(precision).lower()
    if "bf16" in text:
        return "bf16"
    if text.startswith("16"):
        return "fp16"
    return "fp32"


_NEMO_REQUIRED = {
    "devices": "trainer.devices",
    "num_layers": "model.num_layers",
    "hidden_size": "model.hidden_size",
    "num_heads": "model.num_attention_heads",
    "seq_len": "model.encoder_seq_length",
    "micro_batch": "model.micro_batch_size",
    "global_batch": "model.global_batch_size",
}


def read_nemo_log(
    path: str | Path,
    *,
    gpu: str,
    gpus_per_node: int | None = None,
    skip_first: int = DEFAULT_SKIP_FIRST,
    vocab_size: int | None = None,
) -> ReadResult:
    """Read a NeMo (Megatron GPT) training log into one run record.

    Args:
        path: the log (stdout of ``megatron_gpt_pretraining.py`` or an MLPerf NeMo run).
        gpu: the device name, as printed, or a catalog id.
        gpus_per_node: GPUs per node; default ``trainer.devices``.
        skip_first: logged step times dropped as warm-up.
        vocab_size: padded vocabulary size, when the log has no ``Padded vocab_size`` line
            and the config no ``model.override_vocab_size``/``model.vocab_size``.

    Returns:
        ``records``: one row, :data:`RECORD_COLUMNS`; ``rejected``: empty.

    Raises:
        DatasetError: the file is missing; there is no config dump or it lacks required keys
            (all named: trainer.devices, model.num_layers, model.hidden_size,
            model.num_attention_heads, model.encoder_seq_length, model.micro_batch_size,
            model.global_batch_size, and a vocabulary size); no step times are found.
    """
    text = _read_text(path)
    cfg = parse_simple_yaml(_nemo_config_lines(text))
    if not cfg:
        raise DatasetError(f"{path}: no NeMo config dump (a 'trainer:' block) found")
    fields: dict[str, object] = {key: _int(_get(cfg, name)) for key, name in _NEMO_REQUIRED.items()}
    padded = _NEMO_VOCAB.findall(text)
    fields["vocab_size"] = (
        (int(padded[-1]) if padded else None)
        or vocab_size
        or _int(_get(cfg, "model.override_vocab_size"))
        or _int(_get(cfg, "model.vocab_size"))
    )
    missing = [name for key, name in _NEMO_REQUIRED.items() if fields[key] is None]
    if fields["vocab_size"] is None:
        missing.append("vocab size ('Padded vocab_size' line, model.override_vocab_size or vocab_size=)")
    if missing:
        raise DatasetError(f"{path}: missing or invalid NeMo config key(s): {', '.join(missing)}")
    times = _nemo_step_times(text)
    if not times:
        raise DatasetError(f"{path}: no step times ('train_step_timing in s=' or MLLOG tracked_stats) found")
    median, std, n = _step_stats(times, skip_first, path)
    devices = fields.pop("devices")
    num_nodes = _int(_get(cfg, "trainer.num_nodes")) or 1
    heads, layers = fields["num_heads"], fields["num_layers"]
    pp = _int(_get(cfg, "model.pipeline_model_parallel_size")) or 1
    activation = str(_get(cfg, "model.activation") or "").lower()
    optim = str(_get(cfg, "model.optim.name") or "").lower()
    granularity = str(_get(cfg, "model.activations_checkpoint_granularity") or "").lower()
    vpp = _int(_get(cfg, "model.virtual_pipeline_model_parallel_size")) or 1
    num_experts = _int(_get(cfg, "model.num_moe_experts"))
    fields.update(
        num_kv_heads=_int(_get(cfg, "model.num_query_groups")) or heads,
        ffn_hidden_size=_int(_get(cfg, "model.ffn_hidden_size")) or 4 * fields["hidden_size"],
        tp=_int(_get(cfg, "model.tensor_model_parallel_size")) or 1,
        pp=pp,
        cp=_int(_get(cfg, "model.context_parallel_size")) or 1,
        ep=_int(_get(cfg, "model.expert_model_parallel_size")) or 1,
        vpp=vpp if layers % (pp * vpp) == 0 else 1,
        sequence_parallel=_flag(_get(cfg, "model.sequence_parallel")),
        zero_stage=1 if "distributed" in optim else 0,
        recompute=granularity if granularity in ("full", "selective") else "none",
        finetune="full",
        lora_rank=0,
        dtype=_nemo_dtype(cfg),
        gpu=gpu,
        num_experts=num_experts,
        top_k=_int(_get(cfg, "model.moe_router_topk")) if num_experts else None,
        gated_mlp="swiglu" in activation or "geglu" in activation,
        tied_embeddings=_flag(_get(cfg, "model.share_embeddings_and_output_weights"))
        if _get(cfg, "model.share_embeddings_and_output_weights") is not None
        else True,
        flash_attention=_flag(_get(cfg, "model.use_flash_attention")),
        timing_scope="step",
        measured_step_std_ms=std,
        n_iterations=n,
        log_interval=None,
        framework="nemo",
        source=f"nemo_log:{Path(path).name}",
    )
    fields[RUN_MEASURED_COLUMN] = median
    _layout(fields, devices * num_nodes, gpus_per_node or devices, path)  # type: ignore[operator]
    return ReadResult(records=_record(fields), rejected=pd.DataFrame(columns=[REASON_COLUMN]))
