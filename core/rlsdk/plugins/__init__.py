"""The plugin system: hook specifications, the records plugins return, the plugin manager, loading by
path, the call points, and :class:`~rlsdk.plugins.run_plugins.RunPlugins` (a run's plugins, resolved once).
Internal: plugins import the public names from ``rlsdk``."""
