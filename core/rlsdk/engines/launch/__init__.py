"""Processes rlsdk starts for a run: SGLang servers and the router in front of them (:mod:`.sglang`)."""
