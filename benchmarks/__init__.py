"""`pw-bench`: the Pathways paper's experiments as side-by-side benchmarks.

Each benchmark module has `NAME`, `HEADLINE` (the names of its headline
ratios) and `run(quick: bool) -> dict`, returning a record made by
`harness.record`. Our system and its baselines run in the same process,
interleaved, several times; the results are medians and ratios.
"""
