"""The plugin system: hook specifications, the records plugins return, the plugin manager, loading by
path, the one call point per kind, and the defaults core registers itself."""
