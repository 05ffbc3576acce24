"""A Tinker-compatible training API: ``rlsdk tinker serve`` answers the ``tinker`` SDK's requests (sessions,
``forward_backward``, ``optim_step``, ``sample``, checkpoints) with rlsdk's torch trainer and engines, so that
a Tinker recipe trains on the user's own machine with only its base URL changed (docs/tinker.md).

Nothing here is imported by ``import rlsdk``: the server's modules load torch, transformers and the ``tinker``
package (the wire schema), all on first use."""
