"""The Spec-Bench job (`python -m speculative.spec_bench`): Spec-Bench's questions asked through the
target's chat template, each question one conversation, plain and speculative decoding interleaved
question by question, scored as Spec-Bench scores."""
