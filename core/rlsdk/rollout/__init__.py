"""The rollout loop: one step (generate, reward, filter, account in the ledger), eval, the job behind
``rlsdk run``, tool calls and the rollout buffer service."""
