"""voltgate's benchmark suite: a load generator, overhead and batching benches, plots and the CPU suite."""
