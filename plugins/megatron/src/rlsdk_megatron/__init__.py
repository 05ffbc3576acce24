"""rlsdk-megatron: ``--trainer megatron``, megatron-core's ``GPTModel`` trained with rlsdk's losses.

The plugin module imports neither torch nor megatron-core: the trainer loads them when a run builds it.
"""
