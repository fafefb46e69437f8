"""The jobs' code, one package per job (`jobs.infer`, `jobs.benchmark`), and `jobs.common`: what
both do alike (loading the models, mapping NaN logits to a JobError, the output directory's lock
and the compilation cache). The commands stay `python -m speculative.infer` and
`python -m speculative.benchmark`; those modules are thin entry points. No job imports another.
"""
