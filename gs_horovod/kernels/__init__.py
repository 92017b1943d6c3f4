"""Count-Sketch kernels and each framework's :class:`~gs_horovod.array_ops.ArrayOps`.

- :mod:`.hashing`: hash v2 (``HASH_VERSION``), the bucket/sign spec every backend computes bit
  for bit, with its NumPy reference.
- :mod:`.torch_ops`: torch-op kernels and the dispatch of torch tensors to every backend:
  ``accumulate``, ``accumulate_at``, ``heavy_hitters``, ``top_abs``.
- :mod:`.numba_cpu`: ``@njit(parallel=True)`` kernels for the CPU.
- :mod:`.numba_cuda`: ``@cuda.jit`` kernels for NVIDIA GPUs (tested under the CUDA simulator).
- :mod:`.tf_ops`: the same contract in pure TensorFlow ops (graph-safe).
"""

BACKENDS = ("auto", "torch", "numba", "cuda")
