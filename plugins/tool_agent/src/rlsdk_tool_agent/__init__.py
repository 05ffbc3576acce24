"""An example agent package: a tool-using agent written with the ``openai`` client, trained by rlsdk."""
