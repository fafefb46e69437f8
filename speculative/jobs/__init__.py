"""The jobs' code, one package per command (`jobs.infer`, `jobs.benchmark`, `jobs.train`,
`jobs.train_head`, `jobs.demo`), and what they share: `jobs.common` (loading the models, mapping
NaN logits to a JobError, the output directory's lock and the compilation cache), `jobs.config`
(`InferConfig`, the gin config infer, benchmark and the notebook read) and `jobs.spmd` (meshes,
several hosts, the persistent compilation cache). The commands stay `python -m speculative.infer`
and so on; those modules are thin entry points. No job imports another.
"""
