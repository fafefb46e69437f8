"""Drafts: what proposes the gamma tokens of a speculative round (docs/design.md §6).

A draft is one file implementing `base.Drafter`; `decoding.speculative_loop` calls only that
interface. `model.ModelDrafter` (a second, smaller LanguageModel) is the paper's draft.
"""
