"""What the training examples (``scripts/examples``) and the benchmarks (``scripts/bench``)
share, so that every script imports only the library: the workloads (real data and models,
:mod:`.workloads`), the examples' flags, optimizer switch and report (:mod:`.cli`), and the
method variants the benchmarks name with their collectives (:mod:`.variants`).
Not needed to use GsSketch; imports torch, scikit-learn and tqdm."""
