"""trainstack's benchmarks: `python -m bench` measures the trainer and rewrites bench/RESULTS.md (see bench.run_all)."""
