"""Rewards: the protocol (base), combining and guarding them (combine), the registry of the forms
``--reward`` takes (registry), and one file per reward form, each registering itself
(docs/guides/rewards.md)."""
