"""Tensor parallelism: the process group, how the model is split, the per-rank workers and the
executor that drives them (docs/design.md, "Tensor parallelism")."""
