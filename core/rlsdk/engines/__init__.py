"""The engine protocol: the :class:`~rlsdk.engines.engine.InferenceEngine` interface, SGLang's native
protocol shapes, the client for SGLang-protocol servers, the HTTP server for any engine and the rules it
applies, the health check before a run, per-sample engine statistics, and the launch of SGLang servers."""
