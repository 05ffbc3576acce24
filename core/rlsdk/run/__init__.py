"""The composition layer (the top floor of core): a run's plugins resolved once (:mod:`.session`), the
outer loop behind ``rlsdk run`` (:mod:`.job`), the output folder and resume rules (:mod:`.output`), the
Ray wiring (:mod:`.ray_wiring`) and the engine server with its chat routes (:mod:`.engine_server`)."""
