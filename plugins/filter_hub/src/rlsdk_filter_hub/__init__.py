"""rlsdk-filter-hub: dynamic, over-sampling and buffer filters registered by name."""
