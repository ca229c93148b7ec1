"""Studies over training runs: `t2i-gcpo compare` (arms of algorithms × seeds, trained and compared on their
held-out evaluations; compare.py) and the matched-budget study of the allocation schemes (budget.py). They
drive `train`, so they stand above it; the benchmark runners of eval/ do not."""
