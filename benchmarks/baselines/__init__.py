"""Frozen copies of implementations from before an optimisation, kept only so that a
benchmark can measure the new code against the old in the same run (a ratio shares the
noise of a shared machine). Nothing in the package imports them."""
