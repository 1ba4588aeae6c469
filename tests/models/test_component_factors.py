"""The physical factors of the composed step's parts: recovered from runs, pulled toward their centre."""

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.models.component_factors import (
    COMPONENTS,
    FACTOR_RANGE,
    STACK_COLUMN,
    ComponentFactors,
    component_shares,
    stack_labels,
)


def _runs(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    attention = rng.uniform(0.0, 0.7, n)
    comm = rng.uniform(0.0, 0.3, n) * (1 - attention)
    columns = {c: np.zeros(n) for names in COMPONENTS.values() for c in names}
    columns.update(frac_attention=attention, frac_comm_dp=comm, frac_compute=1 - attention - comm)
    return pd.DataFrame(columns)


def test_factors_are_recovered_from_runs_that_exercise_them():
    X = _runs()
    shares = component_shares(X, ("attention", "compute", "communication"))
    truth = np.array([2.5, 1.1, 0.8])
    log_ratio = np.log1p(shares @ (truth - 1)) + np.random.default_rng(1).normal(0, 0.01, len(X))
    fitted = ComponentFactors.fit(shares, log_ratio, names=("attention", "compute", "communication"), prior=0.0)
    np.testing.assert_allclose(list(fitted.factors.values()), truth, rtol=0.03)
    np.testing.assert_allclose(fitted.log_scale(X), np.log1p(shares @ (truth - 1)), atol=0.02)


def test_an_unexercised_component_stays_at_its_centre_and_the_prior_shrinks():
    X = _runs().assign(frac_attention=0.0)
    shares = component_shares(X, ("attention",))
    log_ratio = np.full(len(X), 0.3)  # every run slower, none through attention
    assert ComponentFactors.fit(shares, log_ratio, names=("attention",)).factors["attention"] == pytest.approx(1.0)
    busy = component_shares(_runs(), ("attention",))
    target = np.log1p(busy[:, 0] * (3.0 - 1.0))
    free = ComponentFactors.fit(busy, target, names=("attention",), prior=0.0).factors["attention"]
    pulled = ComponentFactors.fit(busy, target, names=("attention",), prior=1.0).factors["attention"]
    assert free == pytest.approx(3.0, rel=1e-3) and 1.0 < pulled < free


def test_factors_stay_in_range_and_round_trip():
    X = _runs()
    shares = component_shares(X, ("attention",))
    huge = ComponentFactors.fit(shares, np.full(len(X), 5.0), names=("attention",), prior=0.0)
    assert huge.factors["attention"] == pytest.approx(FACTOR_RANGE[1])
    assert ComponentFactors.from_dict(huge.to_dict()) == huge
    with pytest.raises(ValueError, match="unknown"):
        ComponentFactors.from_dict({"memory": 1.0})
    with pytest.raises(ValueError, match="outside"):
        ComponentFactors.from_dict({"attention": 100.0})


def test_stacks_depart_from_the_global_factor_and_an_unknown_stack_gets_the_global_one():
    X = _runs(600)
    stacks = np.array(["transformer-engine", "flash-attention-2"] * 300, dtype=object)
    shares = component_shares(X, ("attention",))
    truth = np.where(stacks == "flash-attention-2", 1.8, 1.0)
    log_ratio = np.log1p(shares[:, 0] * (truth - 1))
    kw = {"names": ("attention",), "prior": 0.0, "stacks": stacks, "stack_components": ("attention",)}
    loose = ComponentFactors.fit(shares, log_ratio, **kw, stack_prior=1e-5)
    assert loose.by_stack["transformer-engine"]["attention"] == pytest.approx(1.0, rel=0.01)
    assert loose.by_stack["flash-attention-2"]["attention"] == pytest.approx(1.8, rel=0.01)
    assert 1.0 < loose.factors["attention"] < 1.8  # the global factor sits between the stacks
    tight = ComponentFactors.fit(shares, log_ratio, **kw, stack_prior=100.0)
    assert tight.by_stack["flash-attention-2"]["attention"] == pytest.approx(tight.factors["attention"], rel=0.01)
    query = X.head(3).assign(**{STACK_COLUMN: ["flash-attention-2", None, "deepspeed"]})
    k = [loose.of_stack(s)["attention"] for s in stack_labels(query)]
    glob = loose.factors["attention"]
    assert k == [loose.by_stack["flash-attention-2"]["attention"], glob, glob]
    np.testing.assert_allclose(loose.log_scale(query), np.log1p(query["frac_attention"].to_numpy() * (np.array(k) - 1)))
    assert ComponentFactors.from_dict(loose.to_dict()) == loose
    assert loose.part_factors("flash-attention-2")["attention"] == loose.by_stack["flash-attention-2"]["attention"]
    with pytest.raises(SpecError, match="stack_components"):
        ComponentFactors.fit(shares, log_ratio, names=("attention",), stacks=stacks, stack_components=("compute",))


def test_bad_inputs_name_the_problem():
    X = _runs()
    with pytest.raises(SpecError, match="unknown"):
        component_shares(X, ("memory",))
    with pytest.raises(SpecError, match="lack"):
        component_shares(X.drop(columns="frac_attention"), ("attention",))
    shares = component_shares(X, ("attention",))
    with pytest.raises(SpecError, match="non-negative"):
        ComponentFactors.fit(shares, np.zeros(len(X)), names=("attention",), weights=-np.ones(len(X)))
    with pytest.raises(SpecError, match="shape"):
        ComponentFactors.fit(shares, np.zeros(3), names=("attention",))


def test_the_default_predictors_breakdown_carries_its_physical_factors():
    from perfcast.features.run_config import parse_run_row
    from perfcast.models.step_predictor import StepPredictor
    from perfcast.serve.predictors import load_step_predictor

    default = load_step_predictor(None)
    composed = StepPredictor(default.op_predictor, default.collective_predictor)
    configs = [parse_run_row({"model": "llama2-7b", "gpu": "h100-sxm5-80gb", "seq_len": 16384, "global_batch": 8})]
    learned, plain = default.predict_configs(configs), composed.predict_configs(configs)
    factors = default.step_model.factors_.factors
    assert factors["attention"] > 1.0 and "compute" not in factors  # the rest of the compute is not rescaled
    relative = factors["attention"]
    np.testing.assert_allclose(learned["attention_ms"] / learned["compute_ms"],
                               relative * plain["attention_ms"] / plain["compute_ms"])  # fmt: skip
    parts = [c for c in learned.columns if c.endswith("_ms") and not c.startswith(("step", "composed"))]
    np.testing.assert_allclose(learned[parts].sum(axis=1), learned["step_ms"])


def test_scale_parts_applies_each_rows_stack_factor_and_from_dict_refuses_stray_stack_components():
    factors = ComponentFactors({"attention": 1.5}, {"flash-attention-2": {"attention": 2.0}})
    breakdown = pd.DataFrame({"attention_ms": [10.0, 10.0, 10.0], "compute_ms": [5.0, 5.0, 5.0]})
    scaled = factors.scale_parts(breakdown, ["flash-attention-2", None, "unseen"])
    assert scaled["attention_ms"].tolist() == [20.0, 15.0, 15.0] and scaled["compute_ms"].tolist() == [5.0] * 3
    assert breakdown["attention_ms"].tolist() == [10.0] * 3  # the input is left alone
    with pytest.raises(ValueError, match="no global factor"):
        ComponentFactors.from_dict({"attention": 1.5, "by_stack": {"x": {"compute": 2.0}}})
