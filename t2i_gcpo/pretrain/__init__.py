"""Pretraining the shipped models on the embedded worlds: the ShapeWorld AR and masked priors
(shapeworld_ar, shapeworld_masked), the arithmetic solver (arithmetic), and their shared optimizer (optim)."""
