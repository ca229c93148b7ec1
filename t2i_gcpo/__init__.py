"""t2i-gcpo: RL for discrete-token text-to-image generators with token-level credit assignment."""

__version__ = "0.1.0"
