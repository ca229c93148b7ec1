"""Analyses of a model outside training: credit maps and credit lift (the `credit-map` command's logic)."""
