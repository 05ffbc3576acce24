"""The engine protocol: the :class:`~rlsdk.engines.engine.InferenceEngine` interface, SGLang's native
protocol shapes, the client for SGLang-protocol servers, the rules a service applies to its requests, and
the launch of SGLang servers. Internal: plugins import the public names from ``rlsdk``."""
