"""What an evaluation records — its protocol (`protocol`) and one row per scored item — and the paired
comparison of two records (`paired`). Below the training loop (which records its held-out evaluations the
same way) and the evaluation commands, which both use it."""
