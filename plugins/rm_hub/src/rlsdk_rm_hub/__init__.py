"""rlsdk-rm-hub: reward functions registered by name."""
