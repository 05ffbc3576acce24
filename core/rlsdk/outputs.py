"""Names of the files in a run's output folder that more than one part of rlsdk reads."""

STATE_FILE = "state.json"
"""The run state ``--resume`` continues from: next step, output file sizes, data position, settings, the
last checkpoint (relative to the output folder)."""
