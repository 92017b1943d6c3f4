"""The gs-SGD engine on simulated ranks (sketches averaged by hand) and its options."""

from __future__ import annotations

import pytest
import torch

from gs_horovod.gs_sgd import GsConfig, GsSgd
from gs_horovod.torch import GsSketch, TorchOps


def ranks_step(engines: list[GsSgd], grads: list[torch.Tensor], name: str = "w") -> torch.Tensor:
    """One gs-SGD step of P simulated ranks; the allreduces are means computed here."""
    merged = torch.stack([e.encode(name, g) for e, g in zip(engines, grads)]).mean(0)
    selections = [e.select(name, merged) for e in engines]
    values = torch.stack([s.local for s in selections]).mean(0) if engines[0].config.exact else selections[0].estimates
    updates = [e.apply(name, s, values) for e, s in zip(engines, selections)]
    for u in updates[1:]:
        assert torch.equal(u, updates[0])
    return updates[0]


@pytest.mark.parametrize("exact", [True, False])
def test_residual_carries_exactly_what_was_not_sent(exact):
    P, d = 3, 4096
    engines = [GsSgd(GsConfig(ratio=0.01, exact=exact), TorchOps("numba")) for _ in range(P)]
    g = torch.Generator().manual_seed(0)
    applied = torch.zeros(d, dtype=torch.float64)
    fed = torch.zeros(d, dtype=torch.float64)
    for _ in range(5):
        before = [e.states["w"].residual.clone() if "w" in e.states else torch.zeros(d) for e in engines]
        grads = [torch.randn(d, generator=g) for _ in range(P)]
        update = ranks_step(engines, grads)
        acc = [b + gr for b, gr in zip(before, grads)]
        sent = update != 0
        for e, a in zip(engines, acc):
            # every rank zeroes the same k coordinates and keeps the rest of a_t as it was
            torch.testing.assert_close(e.states["w"].residual, torch.where(sent, torch.zeros(d), a))
        assert int(sent.sum()) == 41  # k = ceil(0.01 · 4096)
        applied += update.double()
        fed += sum(gr.double() for gr in grads)
    if exact:
        # Σ_steps Σ_ranks g = P · Σ_steps Δ + Σ_ranks e: every gradient applied or still held
        held = sum(e.states["w"].residual.double() for e in engines)
        torch.testing.assert_close(P * applied + held, fed, rtol=1e-6, atol=1e-4)


def test_k_equal_d_exact_is_the_dense_mean():
    P, d = 2, 2048
    engines = [GsSgd(GsConfig(ratio=1.0, rows=1, width=1.0, exact=True), TorchOps("torch")) for _ in range(P)]
    grads = [torch.randn(d) for _ in range(P)]
    update = ranks_step(engines, grads)
    torch.testing.assert_close(update, (grads[0] + grads[1]) / 2, rtol=0, atol=1e-6)
    assert all(e.states["w"].residual.abs().max() == 0 for e in engines)


def test_warmup_sends_dense_then_sketches():
    engine = GsSgd(GsConfig(ratio=0.01, warmup_steps=2), TorchOps("torch"))
    g = torch.randn(5000)
    for _ in range(2):
        payload = engine.encode("w", g)
        assert payload.shape == (5000,) and torch.equal(payload, g)  # a_t = 0 + g
        engine.commit_dense("w")
        assert engine.states["w"].residual.abs().max() == 0
    assert engine.encode("w", g).shape == (5, 200)  # rows × ceil(4 · 50)


def test_a_discarded_step_leaves_residual_and_momentum_as_they_were():
    engine = GsSgd(GsConfig(k=10, width=50.0, momentum=0.9), TorchOps("torch"))
    g = torch.randn(5000)
    table = engine.encode("w", g)
    sel = engine.select("w", table)
    engine.apply("w", sel, sel.local)
    residual, momentum = engine.states["w"].residual.clone(), engine.states["w"].momentum.clone()
    bad = g.clone()
    bad[3] = float("nan")
    engine.encode("w", bad)
    assert engine.discard("w") is False  # this rank brought the NaN
    assert torch.equal(engine.states["w"].residual, residual)
    assert torch.equal(engine.states["w"].momentum, momentum)
    assert engine.states["w"].steps == 1


def test_k_larger_than_a_tensor_is_an_error_naming_it():
    engine = GsSgd(GsConfig(k=5000), TorchOps("torch"))
    with pytest.raises(ValueError, match="k=5000 exceeds the 4096 elements of tensor 'fc.weight'"):
        engine.encode("fc.weight", torch.randn(4096))


def test_momentum_correction_masks_sent_coordinates():
    engine = GsSgd(GsConfig(k=1, width=2000.0, momentum=0.5), TorchOps("torch"))
    g = torch.zeros(10_000)
    g[7] = 100.0
    g[8] = 1.0
    table = engine.encode("w", g)
    update = engine.apply("w", engine.select("w", table), engine.select("w", table).local)
    assert update[7] == 100.0
    st = engine.states["w"]
    assert st.momentum[7] == 0 and st.residual[7] == 0
    assert st.momentum[8] == 1.0 and st.residual[8] == 1.0
    engine.encode("w", g)  # u = 0.5·u + g, a = e + u
    assert st.next_momentum[8] == 1.5 and st.next_momentum[7] == 100.0
    assert st.acc[8] == 2.5


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"ratio": 0.0}, ValueError, r"ratio must be in \(0.0, 1.0\]"),
        ({"ratio": 1.5}, ValueError, "ratio"),
        ({"ratio": "0.1"}, TypeError, "ratio must be a number"),
        ({"k": 0}, ValueError, "k must be in"),
        ({"k": 2.5}, TypeError, "k must be an int"),
        ({"rows": 0}, ValueError, "rows must be in"),
        ({"width": 0}, ValueError, "width must be in"),
        ({"seed": -1}, ValueError, "seed"),
        ({"exact": 1}, TypeError, "exact must be a bool"),
        ({"momentum": 1.0}, ValueError, "momentum"),
        ({"backend": "opencl"}, ValueError, "backend must be one of"),
        ({"min_size": True}, TypeError, "min_size must be an int"),
        ({"nonfinite": "ignore"}, ValueError, "nonfinite must be one of"),
        ({"check_every": -1}, ValueError, "check_every must be in"),
    ],
)
def test_invalid_options_are_named(options, error, match):
    with pytest.raises(error, match=match):
        GsConfig(**options)
    with pytest.raises(error, match=match):
        GsSketch(**options)


def test_unknown_option_is_named():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['ratoi'\]"):
        GsSketch(ratoi=0.1)


def test_k_and_cols_follow_the_options():
    cfg = GsConfig(ratio=0.01, width=4.0, rows=5)
    assert (cfg.k_for(1000), cfg.cols_for(1000), cfg.payload_numel(1000)) == (10, 40, 210)
    assert GsConfig(k=50).k_for(2000) == 50


def test_compress_outside_a_distributed_optimizer_is_an_error():
    with pytest.raises(RuntimeError, match="inside hvd.DistributedOptimizer"):
        GsSketch.compress(torch.randn(5000))


def test_integer_and_sparse_tensors_pass_through():
    for t in (torch.arange(5000), torch.randn(3000).to_sparse()):
        out, ctx = GsSketch.compress(t)
        assert out is t and ctx is None and GsSketch.decompress(out, ctx) is t
