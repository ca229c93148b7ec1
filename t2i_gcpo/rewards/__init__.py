"""Rewards: the protocol (base), combining and guarding them (combine), the registry of the forms
``--reward`` takes (registry), the reward server (server) and its client (remote, http_client), the
helpers the forms share (_common), and the forms themselves, one file each in forms/
(docs/guides/rewards.md)."""
