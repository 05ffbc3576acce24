"""rlsdk-generators: rollout functions, custom generators and engines registered by name."""
