"""The benchmark job (`python -m speculative.benchmark`), by concern: settings (validation,
variants and the resolved settings), setup (models, inputs, batches, memory fit), harness (the
programs and their interleaved timing, the step costs), points (benchmark.json's point schema),
cells (a cell's points and pooled alpha, output scoring), header (the run and the machine) and run
(the sweep's order of work)."""
