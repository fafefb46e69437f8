"""Examples in: the JSONL/TSV reader every job and the notebook API share (`inputs`), and seqio
Tasks as an optional source (`seqio_tasks` registers them, `seqio_inputs` reads them)."""
