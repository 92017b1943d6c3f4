"""Count-Sketch kernels for the CPU, compiled by Numba (``@njit(parallel=True)``).

Arrays are NumPy (torch CPU tensors are passed as zero-copy ``.numpy()`` views); ``keys`` is
:func:`.hashing.hash_keys`. Every result is deterministic and independent of the thread count:

- ``accumulate`` / ``accumulate_at``: tasks own (row, column range) pairs, so no two threads
  write the same cell and each cell receives its additions in coordinate (``idx``) order,
  directly onto the table — bitwise what torch's ``index_add_`` and TensorFlow's
  ``tensor_scatter_nd_add`` give. Each task re-hashes the coordinates it scans (one mix each).
- ``heavy_hitters``: contiguous ranges of coordinates per worker, each with its own candidate
  buffer; the answer is the exact top set under (|estimate| desc, index asc), so no schedule
  changes it.
- ``top_abs``: radix select on the float bits (or a sampled threshold), then one collect pass;
  exact under the same order.

Unless ``NUMBA_THREADING_LAYER`` is set, importing this module selects Numba's ``workqueue``
threading layer, not OpenMP (docs/design.md, "Threads"). How many threads the kernels use:
:mod:`gs_horovod.threads`.
"""

from __future__ import annotations

import os

import numba
import numpy as np
from numba import njit, prange

if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"

from .hashing import NAN_KEY, first_threshold_rank, median_of, mix, row_sign, sign_word, signed_cells

_mix = njit(inline="always", cache=True)(mix)
_sign_word = njit(inline="always", cache=True)(sign_word)
_row_sign = njit(inline="always", cache=True)(row_sign)
_median = njit(inline="always", cache=True)(median_of)
_signed_cells = njit(inline="always", cache=True)(signed_cells)

_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_ONE = np.uint64(1)
_S6 = np.uint64(6)
_S63 = np.uint64(63)
_THRESHOLD_SAMPLE = 1 << 16  # cells of |table| (strided) the first threshold is picked from
_SERIAL_BELOW = 1 << 18  # elements below which a serial pass beats starting the thread pool
_BLOCK = 2048  # coordinates per first-stage block of the pruned scan
_LEVELS = ((20, 11), (8, 12), (0, 8))  # (shift, bits) of the radix-select digits of a 31-bit key
_SAMPLED_FROM = 1 << 18  # top_abs on at least this many elements first tries a sampled threshold
_SAMPLE = 1 << 15  # keys of |x| (strided) that sampled threshold is picked from


def _workers(n: int) -> int:
    """Contiguous ranges a pass over ``n`` coordinates is split into: one per thread, each of at
    least 4096 coordinates."""
    return max(1, min(numba.get_num_threads(), n // 4096))


@njit(inline="always", cache=True)
def _scatter_task(table: np.ndarray, idx: np.ndarray, vals: np.ndarray, key: np.uint64, offset: int, dense: bool,
                  j: int, lo: int, hi: int) -> None:
    """Row j, columns [lo, hi): every coordinate's contribution, in coordinate order."""
    ucols = np.uint64(table.shape[1])
    uj = np.uint64(j)
    for i in range(vals.shape[0]):
        g = np.uint64(offset + i) if dense else np.uint64(idx[i])
        z = _mix(g, key)
        u = ((z & _M32) + uj * ((z >> _S32) | _ONE)) & _M32
        b = np.int64((u * ucols) >> _S32)
        if lo <= b < hi:
            if _row_sign(_sign_word(z), j):
                table[j, b] -= vals[i]
            else:
                table[j, b] += vals[i]


@njit(parallel=True, cache=True)
def _scatter(table: np.ndarray, idx: np.ndarray, vals: np.ndarray, key: np.uint64, offset: int, dense: bool,
             threads: int) -> None:
    rows, cols = table.shape
    parts = max(1, (threads + rows - 1) // rows)
    span = (cols + parts - 1) // parts
    for task in prange(rows * parts):
        lo = (task % parts) * span
        _scatter_task(table, idx, vals, key, offset, dense, task // parts, lo, min(cols, lo + span))


@njit(cache=True)
def _scatter_serial(table: np.ndarray, idx: np.ndarray, vals: np.ndarray, key: np.uint64, offset: int,
                    dense: bool) -> None:
    for j in range(table.shape[0]):
        _scatter_task(table, idx, vals, key, offset, dense, j, 0, table.shape[1])


def _scatter_any(table: np.ndarray, idx: np.ndarray, vals: np.ndarray, key: np.uint64, offset: int,
                 dense: bool) -> None:
    threads = numba.get_num_threads()
    if threads == 1 or vals.shape[0] * table.shape[0] < _SERIAL_BELOW:
        _scatter_serial(table, idx, vals, key, offset, dense)
    else:
        _scatter(table, idx, vals, key, offset, dense, threads)


def accumulate(table: np.ndarray, vec: np.ndarray, keys: np.ndarray, offset: int) -> None:
    """table[j, bucket_j(offset+i)] += sign_j(offset+i) * vec[i] for every row j and i < n.

    table: (rows, cols) float32, updated in place; vec: (n,) float32; keys: (1,) int64.
    """
    _scatter_any(table, np.empty(0, np.int64), vec, np.uint64(keys[0]), offset, True)


def accumulate_at(table: np.ndarray, idx: np.ndarray, vals: np.ndarray, keys: np.ndarray) -> None:
    """table[j, bucket_j(idx[i])] += sign_j(idx[i]) * vals[i] for every row j and i < n, in the
    order of i. idx: (n,) int64 global coordinates in [0, 2^62); vals: (n,) float32."""
    _scatter_any(table, idx, vals, np.uint64(keys[0]), 0, False)


@njit(cache=True)
def _compact(bidx: np.ndarray, best: np.ndarray, nb: int, keep: int) -> tuple[int, np.float32]:
    """Keeps, in place and in order, the ``keep`` best of the ``nb`` buffered entries under
    (|est| desc, idx asc) — the buffer is in ascending idx — and returns (keep, the keep-th |est|)."""
    a = np.abs(best[:nb])
    v = np.partition(a, nb - keep)[nb - keep]
    ties = keep - np.sum(a > v)
    m = 0
    for t in range(nb):
        if a[t] > v or (a[t] == v and ties > 0):
            if a[t] == v:
                ties -= 1
            bidx[m] = bidx[t]
            best[m] = best[t]
            m += 1
    return m, v


@njit(parallel=True, cache=True)
def _hit_mask(table: np.ndarray, rows: int, thr: np.float32) -> np.ndarray:
    """Bit c % 64 of word c // 64 of row j: |table[j, c]| >= thr, for the first ``rows`` rows."""
    cols = table.shape[1]
    words = (cols + 63) // 64
    mask = np.zeros((rows, words), np.uint64)
    for jw in prange(rows * words):
        j, wd = jw // words, jw % words
        m = np.uint64(0)
        for c in range(wd * 64, min(cols, wd * 64 + 64)):
            if abs(table[j, c]) >= thr:
                m |= _ONE << np.uint64(c - wd * 64)
        mask[j, wd] = m
    return mask


@njit(parallel=True, cache=True)
def _scan(table: np.ndarray, key: np.uint64, offset: int, length: int, count: int, thr: np.float32,
          workers: int, cap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pruned query: per worker, the buffered (idx, est) with |est| >= its threshold (raised past
    ``count`` entries). Returns (bidx (workers, cap), best (workers, cap), counts (workers,)).

    Per block of coordinates, a first stage tests the first rows - need + 1 rows against a bit
    mask of |table| >= thr (a coordinate missing all of them cannot reach the threshold; the
    mask stays in L1/L2 where the table would not) and lists the others; the second stage
    counts the hits of every row in the mask and reads the table, for a median, only for
    coordinates with ``need`` hits. (The mask is of the first thr: a raised threshold is applied
    to the medians.)
    """
    rows, cols = table.shape
    ucols = np.uint64(cols)
    need = (rows + 1) // 2
    first = rows - need + 1
    mask = _hit_mask(table, rows, thr)
    bidx = np.empty((workers, cap), np.int64)
    best = np.empty((workers, cap), np.float32)
    counts = np.zeros(workers, np.int64)
    for wk in prange(workers):
        start = wk * length // workers
        stop = (wk + 1) * length // workers
        t = thr
        strict = False
        nb = 0
        buf = np.empty(rows, np.float32)
        zb = np.empty(_BLOCK, np.uint64)
        bucket = np.empty((first, _BLOCK), np.uint64)
        listed = np.empty(_BLOCK, np.int64)
        for blk in range(start, stop, _BLOCK):
            m = min(stop, blk + _BLOCK) - blk
            for q in range(m):  # the loops up to the hit test vectorise
                zb[q] = _mix(np.uint64(offset + blk + q), key)
            for j in range(first):
                uj = np.uint64(j)
                for q in range(m):
                    z = zb[q]
                    u = ((z & _M32) + uj * ((z >> _S32) | _ONE)) & _M32
                    bucket[j, q] = (u * ucols) >> _S32
            nl = 0
            for q in range(m):
                hit = np.uint64(0)
                for j in range(first):
                    b = bucket[j, q]
                    hit |= mask[j, b >> _S6] >> (b & _S63)
                listed[nl] = blk + q
                nl += np.int64(hit & _ONE)
            for c in range(nl):
                i = listed[c]
                z = _mix(np.uint64(offset + i), key)
                h2 = (z >> _S32) | _ONE
                u = z & _M32
                hits = 0
                for j in range(rows):
                    b = (u * ucols) >> _S32
                    hits += np.int64((mask[j, b >> _S6] >> (b & _S63)) & _ONE)
                    u = (u + h2) & _M32
                if hits < need:
                    continue
                _signed_cells(table, z, buf)
                e = _median(buf, rows)
                a = abs(e)
                if a > t or (a == t and not strict):
                    if nb == cap:
                        nb, t = _compact(bidx[wk], best[wk], nb, count)
                        strict = True
                        if not a > t:
                            continue
                    bidx[wk, nb] = i
                    best[wk, nb] = e
                    nb += 1
        counts[wk] = nb
    return bidx, best, counts


@njit(cache=True)
def _select(bidx: np.ndarray, best: np.ndarray, counts: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    total = counts.sum()
    idx = np.empty(total, np.int64)
    est = np.empty(total, np.float32)
    m = 0
    for wk in range(counts.shape[0]):
        idx[m:m + counts[wk]] = bidx[wk, :counts[wk]]
        est[m:m + counts[wk]] = best[wk, :counts[wk]]
        m += counts[wk]
    m, _ = _compact(idx, est, total, count)
    return idx[:count], est[:count]


def heavy_hitters(table: np.ndarray, keys: np.ndarray, length: int, count: int,
                  offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` coordinates of [0, length) with the largest |median-of-rows estimate|, ties
    to the smaller index: (idx (count,) int64 ascending, relative to ``offset``; est (count,) f32).

    table: (rows, cols) float32, finite (cells below 2^127). A coordinate can reach |est| >= T
    only if (rows+1)//2 of its cells have |cell| >= T, so each coordinate is tested row by row
    against T and dropped at the first impossible miss; only survivors get a median. T starts at
    an order statistic of |table| (:func:`.hashing.first_threshold_rank`) and is lowered, with a
    rescan, only if fewer than ``count`` coordinates reach it. Extra memory O(threads · count).
    """
    if not 1 <= count <= length:
        raise ValueError(f"count must be in [1, length={length}], got {count}")
    rows, cols = table.shape
    cells = np.abs(table).ravel()
    cells = np.sort(cells[::max(1, cells.size // _THRESHOLD_SAMPLE)])[::-1]
    workers = _workers(length)
    cap = count + max(count // 2, 1024)
    slack, thr = 2.0, np.inf
    while True:
        rank = first_threshold_rank(cells.size, length, count, slack, rows)
        lower = cells[rank - 1] if rank < cells.size else 0
        thr = lower if lower < thr else 0  # each rescan lowers T; at T = 0 every coordinate survives
        bidx, best, counts = _scan(table, np.uint64(keys[0]), offset, length, count, np.float32(thr), workers, cap)
        if counts.sum() >= count or thr == 0:
            return _select(bidx, best, counts, count)
        slack *= 8


@njit(inline="always", cache=True)
def _abs_key(bits: np.uint32) -> np.int64:
    k = np.int64(bits) & 0x7FFFFFFF
    return NAN_KEY if k > 0x7F800000 else k


@njit(inline="always", cache=True)
def _histogram_task(bits: np.ndarray, wk: int, workers: int, shift: int, pshift: int, prefix: int,
                    hist: np.ndarray) -> None:
    n = bits.shape[0]
    for i in range(wk * n // workers, (wk + 1) * n // workers):
        k = _abs_key(bits[i])
        if (k >> pshift) == prefix:
            hist[wk, (k >> shift) & (hist.shape[1] - 1)] += 1


@njit(parallel=True, cache=True)
def _histogram(bits: np.ndarray, workers: int, shift: int, nbins: int, pshift: int, prefix: int) -> np.ndarray:
    """Per worker, the histogram of digit (key >> shift) & (nbins-1) over keys with key >> pshift == prefix."""
    hist = np.zeros((workers, nbins), np.int64)
    for wk in prange(workers):
        _histogram_task(bits, wk, workers, shift, pshift, prefix, hist)
    return hist


@njit(cache=True)
def _histogram_serial(bits: np.ndarray, workers: int, shift: int, nbins: int, pshift: int, prefix: int) -> np.ndarray:
    hist = np.zeros((workers, nbins), np.int64)
    for wk in range(workers):
        _histogram_task(bits, wk, workers, shift, pshift, prefix, hist)
    return hist


@njit(inline="always", cache=True)
def _collect_task(bits: np.ndarray, wk: int, workers: int, shift: int, prefix: int, s: int, t: int,
                  sure: np.ndarray, ties: np.ndarray, max_ties: int) -> None:
    n = bits.shape[0]
    for i in range(wk * n // workers, (wk + 1) * n // workers):
        d = _abs_key(bits[i]) >> shift
        if d > prefix:
            sure[s] = i
            s += 1
        elif d == prefix and t < max_ties:
            ties[t] = i
            t += 1


@njit(parallel=True, cache=True)
def _collect(bits: np.ndarray, workers: int, shift: int, prefix: int, sure_at: np.ndarray, tie_at: np.ndarray,
             sure: np.ndarray, ties: np.ndarray, max_ties: int) -> None:
    """Writes the indices with key >> shift above ``prefix`` into ``sure`` and equal to it into
    ``ties`` (up to max_ties), each worker from its offsets: ascending index order."""
    for wk in prange(workers):
        _collect_task(bits, wk, workers, shift, prefix, sure_at[wk], tie_at[wk], sure, ties, max_ties)


@njit(cache=True)
def _collect_serial(bits: np.ndarray, workers: int, shift: int, prefix: int, sure_at: np.ndarray,
                    tie_at: np.ndarray, sure: np.ndarray, ties: np.ndarray, max_ties: int) -> None:
    for wk in range(workers):
        _collect_task(bits, wk, workers, shift, prefix, sure_at[wk], tie_at[wk], sure, ties, max_ties)


@njit(cache=True)
def _merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty(a.shape[0] + b.shape[0], np.int64)
    i = j = 0
    for m in range(out.shape[0]):
        if j == b.shape[0] or (i < a.shape[0] and a[i] < b[j]):
            out[m] = a[i]
            i += 1
        else:
            out[m] = b[j]
            j += 1
    return out


@njit(inline="always", cache=True)
def _at_least_task(bits: np.ndarray, wk: int, workers: int, key: np.int64, out: np.ndarray,
                   found: np.ndarray) -> None:
    n, cap, f = bits.shape[0], out.shape[1], 0
    for i in range(wk * n // workers, (wk + 1) * n // workers):
        if _abs_key(bits[i]) >= key:
            if f == cap:  # more than the buffer holds: the caller gives up on the sample
                f += 1
                break
            out[wk, f] = i
            f += 1
    found[wk] = f


@njit(parallel=True, cache=True)
def _at_least(bits: np.ndarray, key: np.int64, out: np.ndarray, found: np.ndarray) -> None:
    """Per worker wk (row wk of ``out`` (workers, cap) int64, a contiguous range of ``bits``
    each), the ascending indices whose key is at least ``key``, and in ``found[wk]`` how many;
    cap + 1 means more than ``cap`` (the scan stopped there)."""
    for wk in prange(out.shape[0]):
        _at_least_task(bits, wk, out.shape[0], key, out, found)


@njit(cache=True)
def _at_least_serial(bits: np.ndarray, key: np.int64, out: np.ndarray, found: np.ndarray) -> None:
    for wk in range(out.shape[0]):
        _at_least_task(bits, wk, out.shape[0], key, out, found)


@njit(cache=True)
def _sample_keys(bits: np.ndarray, stride: int) -> np.ndarray:
    keys = np.empty((bits.shape[0] + stride - 1) // stride, np.int64)
    for j in range(keys.shape[0]):
        keys[j] = _abs_key(bits[j * stride])
    return keys


def _top_by_sample(bits: np.ndarray, count: int) -> np.ndarray | None:
    """top_abs with one pass instead of the radix select's two, or None where the sample misled.

    A strided sample of the keys gives a threshold T expected to leave about 3·count keys at or
    above it (plus 16 of the sample's order statistics, for its noise); one pass collects every
    index whose key is at least T. If there are at least ``count`` of them, the exact top lies
    among them (its smallest key is at least T), and the radix select over those few finds it,
    ties to the smaller index as everywhere. Fewer than ``count``, or more than the buffers
    hold: None, and the caller runs the radix select over everything."""
    n = bits.shape[0]
    stride = max(1, n // _SAMPLE) | 1
    sample = _sample_keys(bits, stride)
    m = sample.shape[0]
    rank = int(np.ceil(3 * count * m / n)) + 16
    if rank >= m // 4:
        return None
    key = np.partition(sample, m - rank)[m - rank]
    expected = rank * n // m
    workers = _workers(n)
    out, found = np.empty((workers, 4 * expected + 1024), np.int64), np.zeros(workers, np.int64)
    (_at_least_serial if workers == 1 else _at_least)(bits, key, out, found)
    if found.sum() < count or found.max() > out.shape[1]:
        return None
    idx = np.concatenate([out[wk, :found[wk]] for wk in range(workers)])
    return idx[_top_keys(bits[idx], count, 0, 31, 0)]


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(x)[:-1])).astype(np.int64)


def top_abs(x: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` largest |x| of x (n,) float32: int64 indices (count,) ascending; ties to the
    smaller index; NaN ranks above ±Inf above every finite value (every NaN alike).

    Radix select on the 31-bit key |x|'s bits: a parallel histogram of its top digit finds the
    threshold bucket (a lower digit only if that bucket holds more than max(count, 2^16)
    candidates), then one parallel pass collects the indices above it and the bucket's
    candidates, whose exact cut is found among them the same way. O(n) time, O(count) extra
    memory (beyond the candidates of one bucket). From 2^18 elements and count ≤ n/64 a
    threshold from a strided sample first saves the histogram's pass (:func:`_top_by_sample`);
    the result is the same either way.
    """
    n = x.shape[0]
    if not 1 <= count <= n:
        raise ValueError(f"count must be in [1, n={n}], got {count}")
    bits = x.view(np.uint32)
    if n >= _SAMPLED_FROM and 64 * count <= n:
        picked = _top_by_sample(bits, count)
        if picked is not None:
            return picked
    return _top_keys(bits, count, 0, 31, 0)


def _top_keys(bits: np.ndarray, count: int, level: int, pshift: int, prefix: int) -> np.ndarray:
    """top_abs on float bits whose keys all satisfy key >> pshift == prefix, from digit ``level``."""
    workers = _workers(bits.shape[0])
    serial = workers == 1 or bits.shape[0] < _SERIAL_BELOW
    histogram, collect = (_histogram_serial, _collect_serial) if serial else (_histogram, _collect)
    need = count
    sure_per_worker = np.zeros(workers, np.int64)
    for shift, nbits in _LEVELS[level:]:
        hist = histogram(bits, workers, shift, 1 << nbits, pshift, prefix)
        above = np.cumsum(hist.sum(axis=0)[::-1])[::-1]  # above[d]: keys with this digit >= d
        digit = int(np.flatnonzero(above >= need)[-1])
        higher = hist[:, digit + 1:].sum(axis=1)
        sure_per_worker += higher
        need -= int(higher.sum())
        pshift, prefix = shift, (prefix << nbits) | digit
        level += 1
        in_bucket = hist[:, digit]
        if shift == 0 or in_bucket.sum() <= max(count, 1 << 16):
            break
    max_ties = need if shift == 0 else int(in_bucket.sum())
    sure = np.empty(count - need, np.int64)
    ties = np.empty(max_ties, np.int64)
    collect(bits, workers, pshift, prefix, _exclusive_cumsum(sure_per_worker), _exclusive_cumsum(in_bucket),
             sure, ties, max_ties)
    if shift != 0:
        ties = ties[_top_keys(bits[ties], need, level, pshift, prefix)]
    return _merge(sure, ties)


@njit(cache=True)
def union_sum_dense(idx: np.ndarray, vals: np.ndarray, universe: int) -> tuple[np.ndarray, np.ndarray]:
    """``union_sum`` through a (universe,) buffer: each pair added in ``idx`` order onto zeros
    (vector order, one thread: the sort's bits, a lone -0.0 summing to +0.0), then the
    coordinates that received a pair, ascending. O(n + universe): cheaper than the sort once
    the pairs are a few percent of the universe."""
    sums = np.zeros(universe, np.float32)
    seen = np.zeros(universe, np.bool_)
    for i in range(idx.shape[0]):
        sums[idx[i]] += vals[i]
        seen[idx[i]] = True
    union = np.flatnonzero(seen)
    return union.astype(np.int64), sums[union]
