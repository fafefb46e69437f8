"""Text in, text out for a notebook: `load_pair` and `Pair.generate` (`pipeline`), re-exported as
`speculative.load_pair`."""
