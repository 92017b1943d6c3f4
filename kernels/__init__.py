"""Count-Sketch kernels, installed as ``gs_horovod.kernels``.

- :mod:`.hashing`: the bucket/sign hash every backend computes, bit for bit.
- :mod:`.torch_ops`: torch-op kernels and the dispatch of torch tensors to every backend.
- :mod:`.numba_cpu`: ``@njit(parallel=True)`` kernels for the CPU.
- :mod:`.numba_cuda`: ``@cuda.jit`` kernels for NVIDIA GPUs (tested under the CUDA simulator).
"""

BACKENDS = ("auto", "torch", "numba", "cuda")
