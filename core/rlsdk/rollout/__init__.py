"""The rollout loop: one step (generate, reward, filter, account in the ledger), eval, tool calls, the
rollout buffer service, and core's own rollout plugins (:mod:`.plugin`). Internal: plugins import the public
names from ``rlsdk``."""
