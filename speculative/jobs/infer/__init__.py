"""The inference job (`python -m speculative.infer`), by concern: settings (validation and the
resolved settings), batches (examples, encoding, the job's fixed batches), rows (output rows,
summary.json), plan (GAMMA = 'auto'), decode (the models and the decoding of pending batches) and
run (the job's order of work)."""
