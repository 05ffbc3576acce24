"""The engine protocol: the :class:`~rlsdk.engines.engine.InferenceEngine` interface, SGLang's native
protocol shapes, the client for SGLang-protocol servers, the HTTP server for any engine, health checks
and the launch of SGLang servers."""
