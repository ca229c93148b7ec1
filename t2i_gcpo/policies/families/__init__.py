"""The built-in model families, one module each; every module here registers its family on import
(policies/registry.py imports them all, in name order). Nothing here imports torch."""
