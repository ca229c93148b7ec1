"""The reward forms ``--reward`` takes, one file each, each registering itself with
`t2i_gcpo.rewards.registry.register_reward` (the registry imports every module here but private ``_…``
ones: a new form is a new file and nothing else; docs/guides/rewards.md#adding)."""
