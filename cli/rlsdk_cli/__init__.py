"""The ``rlsdk`` command line."""
