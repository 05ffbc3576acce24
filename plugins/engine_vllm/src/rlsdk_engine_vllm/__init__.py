"""vLLM 0.26 as an rlsdk engine (``--engine vllm``): :class:`~rlsdk_engine_vllm.client.VLLMClient` speaks
rlsdk's engine protocol to a vLLM server it launches (:mod:`.launch`) or is given by URL."""
