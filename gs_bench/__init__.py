"""What the benchmark harness (``scripts/bench``: the benchmarks and the training entry points
``train_*.py``) shares, so that every script imports only the library: the workloads (real data
and models, :mod:`.workloads`), the entry points' flags, optimizer switch and report
(:mod:`.cli`), and the method variants the benchmarks name with their collectives
(:mod:`.variants`).
Not needed to use GsSketch; imports torch, scikit-learn and tqdm."""
