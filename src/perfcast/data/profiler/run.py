"""A profiling sweep (:func:`run_profile`): run a plan of op-table rows within a time
budget, journal every row, resume, and write the ``perfcast-profiler`` dataset.

Journal and output (:func:`run_profile`): every measured or skipped row is appended as one
JSON line to ``OUT/.partial/measurements.jsonl`` (flushed and fsynced), so a sweep
stopped by the budget, Ctrl-C or a crash resumes where it stopped. At the end the dataset
is written with :func:`perfcast.data.dataset.write_dataset` (a temporary sibling folder
that then replaces ``OUT``), so ``.partial`` goes with the old folder only after that
succeeded. The profiler's fields (device, method, plan counts, skipped rows) are in the
card's ``extra``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.dataset import CARD_FILE, DATASET_ENTRIES, PARTIAL_DIR, TABLE_FILES, read_card, write_dataset
from perfcast.data.op_timing import PROFILER_SOURCE
from perfcast.data.profiler.budget import _SETUP_FACTOR, _Rates, estimate_op_s
from perfcast.data.profiler.collectives import _CollectiveGroup
from perfcast.data.profiler.device import DeviceInfo, detect_device
from perfcast.data.profiler.measurement import MIN_FLOOR_REPEATS, OpSkipped, RepeatPolicy
from perfcast.data.profiler.rows import _flag, _footprint_bytes, _int
from perfcast.data.profiler.timing import _check_supported, time_op
from perfcast.data.schema import (
    COLLECTIVE_OP_NAMES,
    GEMM_OP_NAMES,
    OP_TIMING_COLUMN,
    DType,
    OpType,
    shape_columns,
)
from perfcast.data.tables import OP_COLUMNS
from perfcast.errors import DatasetError, SpecError

logger = logging.getLogger(__name__)

SOURCE = PROFILER_SOURCE
JOURNAL_FILE = "measurements.jsonl"
META_FILE = "meta.json"
OPS_FILE = TABLE_FILES["ops"]
DEFAULT_CPU_OP_CAP_S = 0.5
_ROW_COLUMNS = (*(c for c in OP_COLUMNS if c != "gpu"), "backward")
_REDECIDED = frozenset({"cpu-time-cap"})
"""Skip reasons that rest on this run's calibration: a resumed sweep decides those rows again."""


@dataclass(frozen=True)
class ProfileProgress:
    """What :func:`run_profile` reports to its ``progress`` callback before each row and at the end."""

    done: int  # plan rows finished (measured, skipped or found in the journal)
    total: int
    measured: int
    skipped: int
    elapsed_s: float
    budget_s: float
    current: str  # the row about to run; "" at the end


@dataclass(frozen=True)
class ProfileResult:
    """What :func:`run_profile` wrote and how the sweep went."""

    out_dir: Path
    records: pd.DataFrame
    card: dict[str, Any]
    n_measured: int
    n_skipped: int
    skipped_by_reason: dict[str, int]
    n_not_reached: int
    elapsed_s: float

    @property
    def complete(self) -> bool:
        """True when every plan row was measured or skipped."""
        return self.n_not_reached == 0


def _now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _clean_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Shape columns of a plan row as JSON-safe Python values (0 / False for unused)."""
    out: dict[str, Any] = {}
    for col in _ROW_COLUMNS:
        if col in ("op", "dtype"):
            out[col] = str(row.get(col))
        elif col in ("scalar", "causal", "backward"):
            out[col] = _flag(row, col)
        else:
            out[col] = _int(row, col)
    return out


def _describe(row: Mapping[str, Any]) -> str:
    op = str(row.get("op"))
    names = ("batch", "m", "n", "k", "rows", "cols", "heads", "kv_heads", "seq_q", "head_dim", "bytes", "n_ranks")
    shape = " ".join(f"{c}={_int(row, c)}" for c in names if _int(row, c))
    flags = "".join(f" {c}" for c in ("scalar", "causal", "backward") if _flag(row, c))
    return f"{op} {row.get('dtype')} {shape}{flags}"


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise DatasetError(f"output {out_dir} exists and is not a directory")
    if out_dir.is_dir():
        other = sorted(p.name for p in out_dir.iterdir() if p.name not in DATASET_ENTRIES)
        if other:
            raise DatasetError(
                f"output directory {out_dir} holds files that are not a perfcast profile "
                f"({', '.join(other[:5])}); give a new or empty directory"
            )


def _read_journal(path: Path) -> list[dict[str, Any]]:
    """Entries of a journal; a torn last line (a crash mid-write) is dropped."""
    entries = []
    if not path.exists():
        return entries
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s: line %d is not JSON (an interrupted write?); ignored", path, i + 1)
    return entries


def _check_same_device(found: str | None, info: DeviceInfo, where: Path) -> None:
    if found is not None and found != info.name:
        raise DatasetError(
            f"{where} was measured on {found!r}, this run is on {info.name!r}; "
            "resume only on the same device, or start over (--no-resume) or write elsewhere"
        )


def run_profile(
    plan: pd.DataFrame,
    device_kind: str,
    out_dir: str | Path,
    *,
    budget_s: float,
    resume: bool = True,
    progress: Callable[[ProfileProgress], None] | None = None,
    policy: RepeatPolicy | None = None,
    cpu_op_cap_s: float = DEFAULT_CPU_OP_CAP_S,
    flush_l2: bool = False,
    seed: int = 0,
    card_extra: Mapping[str, Any] | None = None,
) -> ProfileResult:
    """Measure ``plan`` rows in order until ``budget_s`` is spent; write the dataset to ``out_dir``.

    Args:
        plan: op-table rows with a ``key`` column (e.g. from
            :func:`perfcast.features.sweeps.profile_plan`); a plan without keys gets
            row-number keys, which do not survive a change of plan.
        device_kind: ``cpu`` or ``cuda``.
        out_dir: dataset directory: ``ops.parquet``, ``card.json`` and, while a sweep is
            unfinished, ``.partial/``. It must be new, empty or an earlier profile.
        budget_s: wall-clock budget, s (calibration included). A row whose estimated cost
            exceeds what is left is not started; later, cheaper rows still are.
        resume: skip rows already in ``.partial`` or in an earlier dataset in ``out_dir``
            and merge with them; False starts over and replaces ``out_dir``.
        progress: called with a :class:`ProfileProgress` before each row and at the end.
        policy: repeat policy (default :class:`RepeatPolicy`).
        cpu_op_cap_s: on CPU, skip rows whose estimated call time exceeds this, s.
        flush_l2: flush the L2 before each CUDA repeat.
        seed: seeds the random inputs.
        card_extra: more fields for ``card.json`` (e.g. the catalog id of the device).

    Returns:
        The records written and the counts.

    Raises:
        DatasetError: cuda unavailable, ``out_dir`` holds other files, or a resume on a
            different device.
        KeyboardInterrupt: re-raised after the journal is closed; ``.partial`` stays so
            the next run resumes.
    """
    start = time.monotonic()
    if budget_s <= 0:
        raise SpecError(f"budget_s={budget_s} must be positive")
    info = detect_device(device_kind)
    policy = policy or RepeatPolicy()
    out_dir = Path(out_dir)
    journal_path, done, prior = _open_partial(out_dir, info, resume)
    plan = plan.reset_index(drop=True)
    keys = plan["key"].astype(str).tolist() if "key" in plan else [f"row{i}" for i in range(len(plan))]
    status = Counter(done[k]["status"] for k in set(keys) if k in done)
    rates = _Rates(info)
    not_reached = 0

    def report(current: str) -> None:
        if progress is not None:
            n_done = status["measured"] + status["skipped"]
            elapsed = time.monotonic() - start
            progress(
                ProfileProgress(n_done, len(plan), status["measured"], status["skipped"], elapsed, budget_s, current)
            )

    with contextlib.ExitStack() as stack:
        journal = stack.enter_context(journal_path.open("a", encoding="utf-8"))
        runner = _RowRunner(info, rates, policy, stack, cpu_op_cap_s=cpu_op_cap_s, flush_l2=flush_l2, seed=seed)
        for key, row in zip(keys, plan.to_dict("records"), strict=True):
            if key in done:
                continue
            remaining = budget_s - (time.monotonic() - start)
            entry = runner.plan_entry(key, row, remaining) if remaining > 0 else None
            if entry is None:
                not_reached += 1
                continue
            if "status" not in entry:
                report(_describe(entry["row"]))
                runner.run(entry)
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
            done[key] = entry
            status[entry["status"]] += 1
        report("")

    elapsed = time.monotonic() - start
    records = _records([e for e in done.values() if not e.get("prior")], info, prior)
    skipped = [e for e in done.values() if e["status"] == "skipped"]
    by_reason = dict(Counter(e["reason"] for e in skipped))
    counts = {"rows": len(plan), "measured": status["measured"], "skipped": status["skipped"]}
    counts |= {"not_reached": not_reached, "skipped_by_reason": by_reason}
    card = _card(info, plan, records, policy, rates, counts, skipped, budget_s, elapsed, flush_l2, cpu_op_cap_s, seed)
    card = _write_profile(out_dir, records, {**card, **dict(card_extra or {})})
    return ProfileResult(
        out_dir=out_dir,
        records=records,
        card=card,
        n_measured=status["measured"],
        n_skipped=status["skipped"],
        skipped_by_reason=by_reason,
        n_not_reached=not_reached,
        elapsed_s=elapsed,
    )


def _open_partial(
    out_dir: Path, info: DeviceInfo, resume: bool
) -> tuple[Path, dict[str, dict[str, Any]], pd.DataFrame | None]:
    """Prepare ``out_dir/.partial``; return the journal path, the entries done so far and earlier records.

    Done entries come from the journal and, on resume, from an earlier dataset in
    ``out_dir`` (its records, flagged ``prior``, and the skipped rows its card lists).
    """
    _check_out_dir(out_dir)
    partial = out_dir / PARTIAL_DIR
    if not resume and partial.exists():
        shutil.rmtree(partial)
    prior, prior_card = _load_prior(out_dir, info) if resume else (None, {})
    partial.mkdir(parents=True, exist_ok=True)
    meta_path = partial / META_FILE
    if meta_path.exists():
        _check_same_device(json.loads(meta_path.read_text()).get("device_name"), info, partial)
    else:
        meta = {"device_kind": info.kind, "device_name": info.name, "started_utc": _now_utc()}
        _fsync_write(meta_path, json.dumps(meta, indent=2).encode())
    done: dict[str, dict[str, Any]] = {}
    for entry in prior_card.get("extra", {}).get("skipped", []):
        if entry.get("reason") not in _REDECIDED:
            done[str(entry["key"])] = {**entry, "status": "skipped"}
    if prior is not None:
        for key in prior["key"].astype(str):
            done[key] = {"key": key, "status": "measured", "prior": True}
    journal_path = partial / JOURNAL_FILE
    for entry in _read_journal(journal_path):
        if entry.get("reason") not in _REDECIDED:
            done[str(entry["key"])] = entry
    return journal_path, done, prior


class _RowRunner:
    """Decides, for each plan row, whether it runs (caps, budget), and runs it."""

    def __init__(
        self,
        info: DeviceInfo,
        rates: _Rates,
        policy: RepeatPolicy,
        stack: contextlib.ExitStack,
        *,
        cpu_op_cap_s: float,
        flush_l2: bool,
        seed: int,
    ) -> None:
        self.info, self.rates, self.policy, self.stack = info, rates, policy, stack
        self.cpu_op_cap_s, self.flush_l2, self.seed = cpu_op_cap_s, flush_l2, seed
        self.collectives: _CollectiveGroup | None = None

    def plan_entry(self, key: str, row: Mapping[str, Any], remaining_s: float) -> dict[str, Any] | None:
        """The row's journal entry: already ``skipped`` (bad row, CPU cap), to run (no
        status), or None when its estimated cost does not fit ``remaining_s``."""
        clean = _clean_row(row)
        entry: dict[str, Any] = {"key": key, "row": clean, "device_name": self.info.name}
        try:
            op, dtype = OpType(clean["op"]), DType.parse(clean["dtype"])
            r = self.rates
            est = estimate_op_s(clean, r.gemm_rate(dtype), r.copy_bytes_per_s, r.vector_elems_per_s)
        except (ValueError, SpecError) as exc:
            return {**entry, "status": "skipped", "reason": "bad-row", "detail": str(exc)}
        try:
            _check_supported(clean, op, dtype, self.info)
        except OpSkipped as exc:
            return {**entry, "status": "skipped", "reason": exc.reason, "detail": exc.detail}
        if self.info.kind == "cpu" and est > self.cpu_op_cap_s:
            detail = f"estimated {est:.2f} s per call > cap {self.cpu_op_cap_s:g} s"
            return {**entry, "status": "skipped", "reason": "cpu-time-cap", "detail": detail}
        p = self.policy
        calls = p.warmup + p.min_repeats if est * (p.warmup + p.min_repeats) <= p.max_time_s else 1 + MIN_FLOOR_REPEATS
        setup = _footprint_bytes(clean, op, dtype) / self.rates.copy_bytes_per_s * _SETUP_FACTOR
        if setup + max(est * calls, min(p.min_time_s, est * p.max_repeats)) > remaining_s:
            return None
        return entry

    def run(self, entry: dict[str, Any]) -> None:
        """Time the entry's row; fill in its measurement, or its skip reason."""
        row, info = entry["row"], self.info
        op = OpType(row["op"])
        try:
            if op in COLLECTIVE_OP_NAMES:  # _check_supported passed: CUDA with enough devices
                if self.collectives is None:
                    self.collectives = self.stack.enter_context(_CollectiveGroup(info.count))
                m = self.collectives.time(row, self.policy)
            else:
                m = time_op(row, info, policy=self.policy, flush_l2=self.flush_l2, seed=self.seed)
            entry.update(status="measured", t_utc=_now_utc(), **asdict(m))
        except OpSkipped as exc:
            entry.update(status="skipped", reason=exc.reason, detail=exc.detail)
        except (RuntimeError, ValueError) as exc:  # a torch failure on one row: record it and go on
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            entry.update(status="skipped", reason="torch-error", detail=detail[:300])


def _card(
    info: DeviceInfo,
    plan: pd.DataFrame,
    records: pd.DataFrame,
    policy: RepeatPolicy,
    rates: _Rates,
    counts: dict[str, Any],
    skipped: list[dict[str, Any]],
    budget_s: float,
    elapsed_s: float,
    flush_l2: bool,
    cpu_op_cap_s: float,
    seed: int,
) -> dict[str, Any]:
    """The profiler's fields of the dataset card (its ``extra``)."""

    def values(col: str) -> list[str]:
        return sorted(set(plan[col].astype(str))) if col in plan and len(plan) else []

    return {
        "device": {
            "kind": info.kind,
            "name": info.name,
            "count": info.count,
            "torch_version": info.torch_version,
            "cuda_version": info.cuda_version,
            "driver_version": info.driver_version,
            "properties": dict(info.properties),
        },
        "gpu": info.record_gpu,
        "dtypes": values("dtype"),
        "ops": values("op"),
        "families": values("family"),
        "method": {
            "timer": "CUDA events around each call" if info.kind == "cuda" else "time.perf_counter_ns around each call",
            "statistic": "median of the timed calls (measured_ms); min, max, std (ddof=1) beside it",
            "warmup_calls": policy.warmup,
            "repeats": policy.describe(),
            "repeat_policy": asdict(policy),
            "l2_flush": bool(flush_l2 and info.kind == "cuda"),
            "inputs": f"torch.randn, seed {seed}",
            "cpu_op_cap_s": cpu_op_cap_s if info.kind == "cpu" else None,
            "calibration": {
                "copy_gbps": rates.copy_bytes_per_s / 1e9,
                "gelu_gelems_per_s": rates.vector_elems_per_s / 1e9,
                "gemm_tflops": {d.value: r / 1e12 for d, r in rates.gemm_flops_per_s.items()},
            },
        },
        "plan": counts,
        "budget_s": budget_s,
        "elapsed_s": round(elapsed_s, 3),
        "skipped": [
            {
                "key": e["key"],
                "op": e.get("row", {}).get("op"),
                "dtype": e.get("row", {}).get("dtype"),
                "reason": e["reason"],
                "detail": e.get("detail", ""),
            }
            for e in skipped
        ],  # fmt: skip
    }


def _load_prior(out_dir: Path, info: DeviceInfo) -> tuple[pd.DataFrame | None, dict[str, Any]]:
    """Records and card of an earlier profile in ``out_dir`` ((None, {}) when there is none)."""
    ops, card = out_dir / OPS_FILE, out_dir / CARD_FILE
    if not ops.exists():
        return None, {}
    try:
        meta = json.loads(card.read_text()) if card.exists() else {}
        prior = pd.read_parquet(ops)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read the earlier profile in {out_dir}: {exc}") from exc
    _check_same_device(meta.get("extra", {}).get("device", {}).get("name"), info, out_dir)
    if "key" not in prior:
        raise DatasetError(f"{ops} has no key column: it was not written by the perfcast profiler")
    return prior, meta


def _records(entries: list[dict[str, Any]], info: DeviceInfo, prior: pd.DataFrame | None) -> pd.DataFrame:
    """Canonical op records of the measured entries, merged with ``prior`` (new rows win).

    Each record's ``timing`` is the device's timer (:attr:`DeviceInfo.record_timing`); rows of a
    ``prior`` profile written before the column get the same value (its device is this one).
    """
    rows = []
    for e in entries:
        if e["status"] != "measured":
            continue
        rec: dict[str, Any] = dict(e["row"])
        op = OpType(rec["op"])
        used = set(shape_columns(op)) | {"op", "dtype", "backward"}
        used |= {"kv_heads", "causal"} if op is OpType.ATTENTION else set()
        used |= {"ranks_per_node"} if op in COLLECTIVE_OP_NAMES else set()
        used |= {"scalar"} if op not in GEMM_OP_NAMES | COLLECTIVE_OP_NAMES | {OpType.ATTENTION} else set()
        for col in _ROW_COLUMNS:
            if col not in used:
                rec[col] = False if col in ("scalar", "causal") else None  # the validator wants flags set
        rec.update(
            gpu=info.record_gpu,
            measured_ms=e["median_ms"],
            measured_min_ms=e["min_ms"],
            measured_max_ms=e["max_ms"],
            measured_std_ms=e["std_ms"],
            n_repeats=e["n_repeats"],
            timing=info.record_timing.value,
            source=SOURCE,
            device_name=info.name,
            device_kind=info.kind,
            torch_version=info.torch_version,
            key=e["key"],
            measured_utc=e.get("t_utc"),
        )
        rows.append(rec)
    columns = [*OP_COLUMNS, "backward", "measured_ms", "measured_min_ms", "measured_max_ms", "measured_std_ms"]
    columns += ["n_repeats", OP_TIMING_COLUMN, "source"]
    columns += ["device_name", "device_kind", "torch_version", "key", "measured_utc"]
    new = pd.DataFrame(rows, columns=columns)
    if prior is not None and len(prior):
        new = pd.concat([prior.reindex(columns=columns), new], ignore_index=True)
        new = new.drop_duplicates("key", keep="last").reset_index(drop=True)
    for col in ("batch", "m", "n", "k", "rows", "cols", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"):
        new[col] = pd.to_numeric(new[col]).astype("Int64")
    for col in ("bytes", "n_ranks", "ranks_per_node", "n_repeats"):
        new[col] = pd.to_numeric(new[col]).astype("Int64")
    for col in ("scalar", "causal", "backward"):
        new[col] = new[col].fillna(False).astype(bool)
    new[OP_TIMING_COLUMN] = new[OP_TIMING_COLUMN].fillna(info.record_timing.value).astype(object)  # older profiles
    for col in ("measured_ms", "measured_min_ms", "measured_max_ms", "measured_std_ms"):
        new[col] = pd.to_numeric(new[col]).astype(float)
    return new


def _fsync_write(path: Path, data: bytes) -> None:
    with path.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _write_profile(out_dir: Path, records: pd.DataFrame, card: dict[str, Any]) -> dict[str, Any]:
    """Write the profile as a dataset folder (atomically, replacing ``out_dir`` and its ``.partial``).

    The profiler's own fields (device, method, plan counts, skipped rows) go to the card's
    ``extra``; returns the card as written.
    """
    method = card["method"]
    how = f"{method['timer']}; {method['statistic']}; {method['repeats']}; warm-up {method['warmup_calls']} calls"
    extra = json.loads(json.dumps(card, default=_json_default))
    write_dataset(out_dir, name=out_dir.name, source=SOURCE, how_measured=how, ops=records, extra=extra)
    return read_card(out_dir)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
