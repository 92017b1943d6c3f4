"""The array operations the gs-SGD engine needs from a framework: :class:`ArrayOps`, which
``gs_horovod.kernels.torch_ops.TorchOps`` and ``gs_horovod.kernels.tf_ops.TfOps`` implement."""

from __future__ import annotations

from typing import Any, Callable, ContextManager, Optional, Protocol

import numpy as np

Array = Any  # a framework's tensor: torch.Tensor, tf.Tensor, ...
MessageCodec = Any  # a gs_horovod.codecs.base.MessageCodec: a wire format's kernels on each backend


class ArrayOps(Protocol):
    """The array operations the engine needs, for one framework. Arrays are 1-D unless said;
    ``idx`` arrays are int64. Predicates are Python bools (torch) or bool tensors (TF)."""

    def zeros(self, shape: tuple[int, ...], like: Array) -> Array:
        """float32 zeros of ``shape`` on ``like``'s device."""

    def zeros_like(self, x: Array) -> Array:
        """Zeros of x's shape, dtype and device."""

    def from_numpy(self, x: np.ndarray, like: Optional[Array] = None) -> Array:
        """The framework's array holding x: on the host, or on ``like``'s device."""

    def copy(self, x: Array) -> Array:
        """A copy of x that later in-place updates of x do not change."""

    def moved(self, x: Array, like: Array) -> Array:
        """A float32 copy of x (any float dtype, any device) on ``like``'s device."""

    def own_threads(self) -> ContextManager[Any]:
        """A context in which the engine's step runs: the framework's CPU threads at this rank's
        share of the node (:func:`gs_horovod.threads.engine_share`), restored after."""

    def wait(self, x: Array) -> None:
        """Returns once x is computed (a device that runs asynchronously is waited for), so that
        a clock read next counts its work."""

    def concat(self, xs: list[Array]) -> Array:
        """The 1-D arrays of ``xs`` (one dtype) laid end to end (may be ``xs[0]`` itself)."""

    def add_parts(self, base: Array, parts: list[Array]) -> Array:
        """A new (n,) f32: base (n,) plus the pieces (d_i,) f32 laid end to end (Σ d_i = n),
        without concatenating them first."""

    def slice(self, x: Array, start: int, size: int) -> Array:
        """x[start:start + size] (may be a view)."""

    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array:
        """x's elements in ``shape`` (may be a view)."""

    def stack(self, xs: list[Array]) -> Array:
        """(len(xs), n): the (n,) arrays of ``xs`` (one dtype) as rows."""

    def dtype_name(self, x: Array) -> str:
        """x's dtype as NumPy names it ("float16", "float32", ...)."""

    def plus_minus(self, value: Any) -> Array:
        """(2,) int64: [value, -value] (value an int or a scalar tensor)."""

    def equal(self, a: Array, b: Array) -> Any:
        """Predicate: the 0-d a equals b."""

    def cast(self, x: Array, dtype: str) -> Array:
        """x as "float16" or "float32"."""

    def take(self, x: Array, idx: Array) -> Array:
        """x[idx]."""

    def scatter(self, n: int, idx: Array, vals: Array, like: Array, tail: Optional[Array] = None) -> Array:
        """A new (n + len(tail),) f32 vector: zero but for vals at idx in [0, n), then ``tail``."""

    def scatter_sub(self, x: Array, idx: Array, vals: Array) -> Array:
        """x with x[idx] -= vals (indices unique); may update x in place."""

    def where(self, mask: Array, a: Array, b: Array) -> Array:
        """a where the bool ``mask`` holds, else b (elementwise, one shape)."""

    def isin_sorted(self, x: Array, ref: Array) -> Array:
        """A bool mask: x[i] in ref (ref ascending)."""

    def all_finite(self, x: Array) -> Any:
        """Predicate: no element of x is NaN or infinite."""

    def not_finite(self, x: Array) -> Array:
        """A 0-d f32: 1 if x has a NaN or infinite element, else 0."""

    def sum_squares(self, x: Array) -> Array:
        """A 0-d f32: Σ x², on x's device."""

    def logical_and(self, a: Any, b: Any) -> Any:
        """Predicate: both predicates a and b."""

    def top_abs(self, x: Array, count: int) -> Array:
        """Indices (count,) ascending of the count largest |x| (NaN/Inf largest; ties: lower index)."""

    def sketch_accumulate(self, table: Array, vec: Array, keys: np.ndarray, offset: int) -> Array:
        """``table`` (rows, cols) f32 plus the sketch of ``vec`` (n,) f32 at coordinates offset..;
        may update in place."""

    def sketch_accumulate_at(self, table: Array, idx: Array, vals: Array, keys: np.ndarray) -> Array:
        """``table`` plus the sketch of the sparse vector with ``vals`` (n,) f32 at ``idx``."""

    def heavy_hitters(self, table: Array, keys: np.ndarray, length: int, count: int) -> tuple[Array, Array]:
        """(idx (count,) ascending, estimates (count,) f32): the count coordinates of [0, length)
        with the largest |median estimate| (ties: lower index), identical for equal tables."""

    def pairs(self, idx: Array, vals: Array) -> Array:
        """(2n,) f32 interleaved [i_0, v_0, i_1, v_1, ...]: idx (n,) int64 in [0, 2^31) as int32
        bit patterns, vals (n,) f32 (for allgather and alltoall; no arithmetic may touch it)."""

    def unpairs(self, buf: Array) -> tuple[Array, Array]:
        """(idx (n,) int64, vals (n,) f32) of buf (2n,) f32, concatenated :meth:`pairs`."""

    def wire_rounded(self, vals: Array, codec: MessageCodec) -> Array:
        """vals (n,) f32 as one message of ``codec`` carries them, as f32 (its ``rounded_*``
        kernel on this framework's backend)."""

    def pack_pairs(self, idx: Array, vals: Array, counts: Array, universe: int, low: int,
                   codec: MessageCodec) -> tuple[Array, Array]:
        """Consecutive runs of counts (M,) pairs of idx (n,) int64 (each run sorted, distinct, in
        [0, universe)) and vals (n,) f32, each a message of ``codec`` with layout ``low`` (its
        ``encode_*`` kernel): (the messages (m,) uint8, the bytes of each (M,) int32)."""

    def unpack_pairs(self, buf: Array, messages: int, universe: int, low: int,
                     codec: MessageCodec) -> tuple[Array, Array, Array]:
        """(idx (n,) int64, vals (n,) f32, the pairs of each message (messages,) int32) of
        ``messages`` messages of ``codec`` laid end to end in buf (uint8)."""

    def take_sorted(self, keys: Array, vals: Array, x: Array, universe: int) -> Array:
        """(len(x),) f32: vals[j] where keys[j] == x (keys sorted, distinct), 0 where x is absent;
        every index below ``universe``."""

    def union_sum(self, idx: Array, vals: Array, counts: Array, universe: int) -> tuple[Array, Array]:
        """(union (u,) int64 ascending, sums (u,) f32) of P sparse vectors laid end to end in
        ``idx`` (n,) int64 / ``vals`` (n,) f32, vector r being the next ``counts[r]`` pairs
        (counts (P,) int32; each vector's indices distinct, below ``universe``): sums[j] = Σ_r
        vals at union[j] in vector r, added in vector order (the same bits everywhere)."""

    def spans(self, x: Array, starts: list[int]) -> list[tuple[Any, Any]]:
        """(first, size) of each run of the ascending x (n,) int64 within [starts[g],
        starts[g+1]) (the last run: from starts[-1] on); ints or scalar tensors."""

    def owner_of(self, idx: Array, ranks: int, keys: np.ndarray) -> Array:
        """(n,) int64 in [0, ranks): the rank that owns each coordinate of idx (n,) int64, a hash
        of the index (the sketch's, one row of ``ranks`` columns): the same on every rank and
        device, evenly spread whatever the layers' sizes and strides."""

    def stable_order(self, x: Array) -> Array:
        """(n,) int64: the permutation that sorts x (n,) int64 ascending, equal values in place."""

    def bucket(self, x: Array, edges: Array) -> Array:
        """(n,) int64: for each x the b with edges[b] <= x < edges[b + 1], for edges (B + 1,)
        int64 ascending (clamped to [0, B - 1])."""

    def count(self, bins: Array, n: int, mask: Optional[Array] = None) -> Array:
        """(n,) int32: how many of ``bins`` (int64 in [0, n)) fall in each bin (where ``mask``)."""

    def pack_counts(self, counts: Array, bits: int) -> Array:
        """(⌈n/w⌉,) int64: counts (n,) int32, each below 2^bits, w = 63 // bits to a word:
        word i = Σ_j counts[j·⌈n/w⌉ + i] << (j·bits). Words add as their counts do while every
        sum stays below 2^bits (no lane carries into the next)."""

    def unpack_counts(self, words: Array, bits: int, n: int) -> Array:
        """(n,) int64: the counts :meth:`pack_counts` packed into ``words`` (or their sums)."""

    def abs_key(self, x: Array) -> Array:
        """(n,) int64 order key of |x| (x f32): its float bits without the sign, every NaN one
        above +Inf (the order :meth:`top_abs` selects by)."""

    def key_bits(self, key: Array, shift: int, bits: int) -> Array:
        """(n,) int64: bits [shift, shift + bits) of ``key`` as a number."""

    def radix_cut(self, counts: Array, wanted: Array) -> tuple[Array, Array]:
        """For G groups' histograms ``counts`` (G·B,) int32 and ``wanted`` (G,) int32 (at most each
        group's total): (cut (G,) int64, the highest bin from whose top the group reaches wanted;
        above (G,) int32, how many lie in the bins above cut)."""

    def equal_at(self, a: Array, b: Array) -> Array:
        """Elementwise a == b, a bool mask."""

    def keep_top(self, prefix: Array, key: Array, group: Array, cut: Array, ties: Array) -> Array:
        """Positions (ascending) of the elements (ordered by index) with prefix > cut[group], and
        of the best ties[group] of those with prefix == cut[group] (by key, then position)."""

    def host_int32(self, x: Array) -> Array:
        """x as int32 on the host (the splits Horovod's alltoall takes)."""

    def size_of(self, x: Array) -> Any:
        """x's element count (int, or an int64 scalar tensor)."""

    def count_of(self, n: Any) -> Any:
        """n as the step's counter type (int, or an int64 scalar tensor)."""

    def checksum(self, idx: Array) -> Any:
        """An int in [0, 2^62) summarising idx (equal for equal idx)."""

    def join_names(self, names: tuple[str, ...], flags: Array) -> Any:
        """The names whose flag is > 0, quoted and comma-separated (a str or string tensor)."""

    def cond(self, pred: Any, true_fn: Callable[[], Any], false_fn: Callable[[], Any]) -> Any:
        """``true_fn()`` if pred else ``false_fn()`` (both return the same structure)."""

    def when(self, pred: Any, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` (a check) if pred; returns a token for :meth:`after`."""

    def fail_unless(self, pred: Any, error: type, message: Callable[[], list[Any]]) -> Any:
        """Raises ``error`` with the joined ``message()`` parts unless pred (torch: now; TF: an
        assertion); returns a token for :meth:`after`."""

    def after(self, checks: list[Any], values: Any) -> Any:
        """``values`` (a nested tuple/list of arrays) once every check has passed."""
