"""The wire formats for (index, value) pairs (gs_horovod/codecs/): round trips, sizes, the values
they cannot carry as they are, each codec's torch and Numba kernels against its NumPy reference
byte for byte, and what the engine keeps in the residuals when it rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gs_horovod.codecs import CODECS, MessageCodec
from gs_horovod.codecs.compact import BF16_MAX
from gs_horovod.codecs.compact8 import SCALE_BYTES
from gs_horovod.codecs.elias_fano import HEADER
from gs_horovod.engine import CommStats, EngineState, GsConfig, GsSgd, Plan
from gs_horovod.kernels.torch_ops import TorchOps
from gs_horovod.transports.simulated import SimulatedRanks


def message_sets() -> list[tuple[int, list[np.ndarray]]]:
    """(universe, each message's sorted distinct indices): random sets, both ends, gaps above
    2^16, one pair, an empty message, every index, and universes past 2^31, 2^40 and 2^60."""
    rng = np.random.default_rng(0)
    return [
        (1_000_000, [np.sort(rng.choice(1_000_000, 1000, replace=False)),
                     np.sort(rng.choice(1_000_000, 700, replace=False))]),
        (1_000_000, [np.array([0, 999_999])]),
        (10_000_000, [np.array([0, 70_000, 140_001, 9_999_999]), np.zeros(0, np.int64), np.array([5])]),
        (5000, [np.zeros(0, np.int64)]),
        (300, [np.arange(300)]),
        (2**31 + 5, [np.array([3, 2**31 - 1, 2**31, 2**31 + 4])]),
        (2**40, [np.sort(rng.choice(2**40, 200, replace=False))] * 3),
        (2**60, [np.array([2**60 - 1])]),  # 59 low bits: past Numba's accumulator, its reference fallback
    ]


COMPACT, COMPACT8 = CODECS["compact"], CODECS["compact8"]
MESSAGE_WIRES = [name for name, codec in CODECS.items() if isinstance(codec, MessageCodec)]  # byte messages


@pytest.mark.parametrize("wire", MESSAGE_WIRES)
@pytest.mark.parametrize("universe,messages", message_sets(), ids=lambda x: str(x) if isinstance(x, int) else None)
def test_round_trip_and_sizes(universe, messages, wire):
    codec = CODECS[wire]
    if not codec.holds(universe):
        pytest.skip(f"wire={wire!r} holds fewer than {universe} coordinates")
    idx = np.concatenate(messages).astype(np.int64)
    rng = np.random.default_rng(1)  # magnitudes over 2^-20 .. 2^20: messages with different scales
    vals = (rng.standard_normal(idx.size) * 2.0 ** rng.integers(-20, 20, idx.size)).astype(np.float32)
    counts = np.array([m.size for m in messages], np.int32)
    low = codec.layout(max(1, idx.size // len(messages)), universe)
    buf, sizes = codec.encode(idx, vals, counts, universe, low)
    assert buf.dtype == np.uint8 and sizes.tolist() == [codec.message_bytes(n, universe, low) for n in counts]
    assert buf.size == sizes.sum()
    got_idx, got_vals, got_counts = codec.decode(buf, universe, low)
    first = np.cumsum(counts) - counts  # each message's values as it rounds them, at its own scale
    want = np.concatenate([codec.rounded_numpy(vals[f:f + n]) for f, n in zip(first, counts)])
    assert np.array_equal(got_idx, idx) and np.array_equal(got_vals, want)
    assert got_counts.tolist() == counts.tolist()
    # the torch kernels write the same bytes and read them back alike
    t_buf, t_sizes = codec.encode_torch(torch.from_numpy(idx), torch.from_numpy(vals), torch.from_numpy(counts),
                                        universe, low)
    assert np.array_equal(t_buf.numpy(), buf) and t_sizes.tolist() == sizes.tolist()
    t_idx, t_vals, t_counts = codec.decode_torch(torch.from_numpy(buf), universe, low)
    assert np.array_equal(t_idx.numpy(), idx) and np.array_equal(t_vals.numpy(), got_vals)
    assert t_counts.tolist() == counts.tolist()
    # ... and so do Numba's (what the CPU engine and TensorFlow run)
    n_buf, n_sizes = codec.encode_numba(idx, vals, counts, universe, low)
    assert np.array_equal(n_buf, buf) and n_sizes.tolist() == sizes.tolist()
    n_idx, n_vals, n_counts = codec.decode_numba(buf, universe, low)
    assert np.array_equal(n_idx, idx) and np.array_equal(n_vals, got_vals) and n_counts.tolist() == counts.tolist()


def test_numba_writes_the_reference_bytes_for_values_16_bits_cannot_hold_and_refuses_what_it_cannot_hold():
    vals = np.array([3.4e38, -3.4e38, 1e-42, np.nan, -np.nan, np.inf, -np.inf, -0.0, 1.0 + 2**-8, 3.3e38],
                    np.float32)
    idx, counts = np.arange(vals.size), np.array([vals.size])
    buf, _ = COMPACT.encode_numba(idx, vals, counts, 64, 2)
    assert np.array_equal(buf, COMPACT.encode(idx, vals, counts, 64, 2)[0])
    for broken in (buf[:-1], buf[:3], np.concatenate([buf, buf[:2]])):
        with pytest.raises(ValueError, match="runs past the end"):
            COMPACT.decode_numba(broken, 64, 2)
    for bad_idx in (np.array([3, 2]), np.array([2, 2]), np.array([0, 64]), np.array([-1, 3])):
        with pytest.raises(ValueError, match="not ascending, distinct and in"):
            COMPACT.encode_numba(bad_idx, vals[:2], np.array([2]), 64, 2)
    with pytest.raises(ValueError, match="indices and"):
        COMPACT.encode_numba(idx, vals, np.array([3]), 64, 2)
    wrong = buf.copy()
    wrong[HEADER + (vals.size * 2 + 7) // 8] ^= 0xFF  # the first byte of the high bits
    with pytest.raises(ValueError, match="high bits disagree"):
        COMPACT.decode_numba(wrong, 64, 2)


def test_an_index_costs_about_2_plus_log2_of_the_gap():
    # n = U/1000: l = 9 low bits, about 2 + 9 + 1 high bits: 28 bits a pair with a bfloat16
    # value, 20 with an E4M3 one (and 2 bytes of scale a message)
    low = COMPACT.layout(1000, 1_000_000)
    assert low == 9
    assert 8 * (COMPACT.message_bytes(1000, 1_000_000, low) - HEADER) / 1000 < 28.1
    assert 8 * (COMPACT8.message_bytes(1000, 1_000_000, low) - HEADER - SCALE_BYTES) / 1000 < 20.1
    assert COMPACT.message_bytes(0, 10, 3) == HEADER
    assert COMPACT8.message_bytes(0, 10, 3) == HEADER + SCALE_BYTES


def test_values_beyond_bfloat16_are_clamped_or_flushed_and_nan_inf_survive():
    vals = np.array([3.4e38, -3.4e38, 1e-42, np.nan, np.inf, -np.inf, -0.0, 1.0 + 2**-8], np.float32)
    got = COMPACT.rounded_numpy(vals)
    assert got[0] == BF16_MAX and got[1] == -BF16_MAX  # finite stays finite
    assert got[2] == 0.0  # below bfloat16's smallest subnormal
    assert np.isnan(got[3]) and got[4] == np.inf and got[5] == -np.inf
    assert got[7] == 1.0  # halfway between 1 and 1 + 2^-7: to the even one
    assert np.array_equal(COMPACT.rounded_torch(torch.from_numpy(vals)).numpy(), got, equal_nan=True)
    assert np.array_equal(COMPACT.rounded_numba(vals), got, equal_nan=True)
    # NaN survives a round trip through a message
    buf, _ = COMPACT.encode(np.array([1, 2, 3]), vals[3:6], np.array([3]), 10, 1)
    _, back, _ = COMPACT.decode_torch(torch.from_numpy(buf), 10, 1)
    assert back.isnan()[0] and back[1] == float("inf") and back[2] == float("-inf")
    # relative rounding error of a finite value in bfloat16's normal range: at most 2^-8 (8 bits)
    x = np.random.default_rng(2).standard_normal(10_000).astype(np.float32) * 1e3
    assert np.max(np.abs(COMPACT.rounded_numpy(x) - x) / np.abs(x)) <= 2**-8


def e4m3_cases() -> np.ndarray:
    return np.array([3.4e38, -3.4e38, 1e-42, np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, 2.0**-20], np.float32)


def test_e4m3_values_never_overflow_nan_inf_survive_and_the_error_is_bounded():
    got = COMPACT8.rounded_numpy(e4m3_cases())
    assert np.isfinite(got[[0, 1, 2, 6, 7, 8, 9]]).all()  # finite stays finite, even ±FLT_MAX
    assert abs(got[0] - 3.4e38) <= 3.4e38 * 2**-4 and got[1] == -got[0]
    assert np.isnan(got[3]) and got[4] == np.inf and got[5] == -np.inf
    assert got[6] == 0 and got[8] == 0  # below 2^-18.8 of the message's largest: flushed to zero
    assert np.array_equal(COMPACT8.rounded_torch(torch.from_numpy(e4m3_cases())).numpy(), got,
                          equal_nan=True)
    assert np.array_equal(COMPACT8.rounded_numba(e4m3_cases()), got, equal_nan=True)
    # a message of its own: its scale maps its largest into (224, 448], so 1.0 and 2^-10 survive
    assert COMPACT8.rounded_numpy(np.array([1.0, 2.0**-10], np.float32)).tolist() == [1.0, 2.0**-10]
    assert COMPACT8.rounded_numpy(np.array([1.0, 2.0**-18], np.float32)).tolist() == [1.0, 0.0]
    # relative error at most 2^-4 (3 mantissa bits, to nearest) within 2^-13 of the largest;
    # ties to even: 1 + 2^-4 is halfway between 1 and 1 + 2^-3
    x = np.random.default_rng(3).standard_normal(10_000).astype(np.float32) * 2.0**40
    x[0] = 2.0**40 * 225  # the largest just above 224 once scaled: the fewest normal binades below it
    kept = np.abs(x) >= np.abs(x).max() * 2.0**-13
    assert np.max(np.abs(COMPACT8.rounded_numpy(x) - x)[kept] / np.abs(x[kept])) <= 2**-4
    for scale in (2.0**-130, 1.0, 2.0**80):  # Numba's and torch's codes, the reference's bits at any scale
        y = (x * scale).astype(np.float32)
        assert np.array_equal(COMPACT8.rounded_numba(y), COMPACT8.rounded_numpy(y))
        assert np.array_equal(COMPACT8.rounded_torch(torch.from_numpy(y)).numpy(), COMPACT8.rounded_numpy(y))
    assert COMPACT8.rounded_numpy(np.array([448.0, 1.0 + 2**-4, 1.0 + 3 * 2**-4], np.float32)).tolist() == \
        [448.0, 1.0, 1.25]
    # NaN and ±Inf leave the scale to the finite values and survive a message
    buf, _ = COMPACT8.encode(np.arange(4), np.array([np.nan, 1.0, np.inf, -np.inf], np.float32), np.array([4]), 10, 1)
    back = COMPACT8.decode_torch(torch.from_numpy(buf), 10, 1)[1]
    assert back.isnan()[0] and back[1] == 1.0 and back[2] == float("inf") and back[3] == float("-inf")


def test_e4m3_refuses_per_layer_scope_and_scales_no_encoder_writes():
    # one scale for every layer: under scope="layer" a quiet layer's top k would all flush
    with pytest.raises(ValueError, match="wire='compact8' scales each message.*scope='layer'"):
        GsConfig(wire="compact8", scope="layer")
    buf, _ = COMPACT8.encode(np.arange(3), np.array([1.0, 2.0, 3.0], np.float32), np.array([3]), 8, 1)
    at = HEADER + 1 + 1  # the scale's two bytes: after the header, 3 low bits and the high bits
    assert COMPACT8.decode(buf, 8, 1)[1].tolist() == [1.0, 2.0, 3.0]
    for e in (-118, 121, -32768):
        bad = buf.copy()
        bad[at:at + 2] = np.array([e], "<i2").view(np.uint8)
        for decode in (lambda b: COMPACT8.decode(b, 8, 1), lambda b: COMPACT8.decode_numba(b, 8, 1),
                       lambda b: COMPACT8.decode_torch(torch.from_numpy(b), 8, 1)):
            with pytest.raises(ValueError, match="scale exponent is outside"):
                decode(bad)


def test_e4m3_rounding_travels_unchanged_in_any_subset_of_the_rounded_set():
    # the engine rounds a rank's whole outgoing set at one scale and sends subsets of it (one
    # message per owner, an owner's chosen sums): a subset's own scale is no coarser, so its
    # message carries those rounded values bit for bit
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(5000) * 10.0 ** rng.uniform(-3, 1, 5000)).astype(np.float32)
    r = COMPACT8.rounded_numpy(x)
    for part in (np.arange(0, 5000, 7), np.argsort(-np.abs(x))[200:400], np.argsort(np.abs(x))[:50]):
        part = np.sort(part)
        buf, _ = COMPACT8.encode(part, r[part], np.array([part.size]), 5000, 3)
        assert np.array_equal(COMPACT8.decode(buf, 5000, 3)[1], r[part])


def test_a_vector_of_2_to_the_31_coordinates_runs_the_exact_exchanges_compact_only():
    big = 2**31 + 10  # laid out, never allocated
    compact = GsConfig(ratio=1e-6, wire="compact")
    assert Plan.build(["w"], [big], compact, ranks=64).exchange == "sparse"
    assert Plan.build(["w"], [big], compact, ranks=2).exchange == "allgather"
    assert Plan.build(["w"], [big], GsConfig(ratio=1e-6, wire="compact8"), ranks=64).exchange == "sparse"
    fp32 = GsConfig(ratio=1e-6, wire="fp32")
    assert Plan.build(["w"], [big], fp32, ranks=64).exchange == "sketch"  # fp32's int32 indices
    with pytest.raises(ValueError, match="wire='compact' and 'compact8' have no limit"):
        Plan.build(["w"], [big], GsConfig(ratio=1e-6, exchange="sparse", wire="fp32"), ranks=4)


@pytest.mark.parametrize("wire", [name for name, codec in CODECS.items() if not codec.lossless])
@pytest.mark.parametrize("exchange", ["allgather", "sparse"])
@pytest.mark.parametrize("P", [2, 3, 4])
def test_rounding_is_kept_in_the_residuals(exchange, P, wire):
    # Σ_r e_r + P·Δ = Σ_r a_r after every step (up to float32 sums of D values): what rounding
    # took from a rank's value stays in its residual, what it took from an owner's sum in the owner's
    D, steps = 20_000, 4
    group = SimulatedRanks(P)
    cfg = GsConfig(ratio=0.01, exchange=exchange, wire=wire, backend="torch")
    states = [EngineState(GsSgd(cfg, TorchOps("torch"), comm), CommStats()) for comm in group.comms]
    gens = [torch.Generator().manual_seed(r) for r in range(P)]
    before = [torch.zeros(D) for _ in range(P)]
    for _ in range(steps):
        grads = [torch.randn(D, generator=g) * torch.rand(D, generator=g) ** 4 for g in gens]
        ups = group.run(lambda r, comm, grads=grads: states[r].step({"w": grads[r].clone()})["w"])
        a = sum(e + g for e, g in zip(before, grads))
        kept = sum(s.residual for s in states) + P * ups[0]
        assert float((kept - a).abs().max()) <= 1e-6 * float(a.abs().max())
        assert int((ups[0] != 0).sum()) >= cfg.k_for(D)
        before = [s.residual.clone() for s in states]


@pytest.mark.parametrize("exchange,P,most", [("allgather", 4, 0.45), ("sparse", 4, 0.5), ("sparse", 16, 0.55),
                                              ("sparse", 64, 0.6)])
def test_compact_about_halves_the_planned_bytes_of_the_exact_exchanges(exchange, P, most):
    # k = D/1000 on the 1.28M digits MLP's size: the allgather's one message of k pairs over D
    # (≈ 28 bits a pair); the sparse exchange's k/P pairs to each owner, whose indices are spread
    # over all of D by the owners' hash (≈ log2 P bits more an index), each message with its count
    def payload(wire: str) -> int:
        cfg = GsConfig(ratio=0.001, exchange=exchange, wire=wire)
        p = Plan.build(["w"], [1_280_000], cfg, ranks=P).payload_bytes(cfg)
        return p.gather + p.alltoall

    assert payload("compact") <= most * payload("fp32")
    assert payload("compact8") <= 0.8 * payload("compact")  # 8 value bits off about 28 a pair, + a scale a message
