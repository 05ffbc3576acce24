"""rlsdk's plugins inside slime, by name: each submodule is one kind of plugin, and any installed plugin of
that kind is an attribute of it, adapted to slime's calling conventions. For example::

    --custom-rm-path rlsdk.slime.reward.deepscaler
    --dynamic-sampling-filter-path rlsdk.slime.dynamic_filter.check_reward_nonzero_std
    --custom-generate-function-path rlsdk.slime.custom_generate.multi_turn
    --rollout-function-path rlsdk.slime.generate_rollout.sglang
    --buffer-filter-path rlsdk.slime.buffer_filter.drop_stale

slime loads these with ``importlib`` and ``getattr``; the adapters (:mod:`rlsdk.slime.adapters`) make
rewards awaitable, return slime's own ``DynamicFilterOutput``, ``RolloutFnTrainOutput`` and ``Sample``
when slime is importable, call slime's data source as ``get_samples(n)``, accept ``rollout_id=None``, and
give rlsdk's plugins rlsdk's defaults for the options slime's ``args`` does not have.
"""
