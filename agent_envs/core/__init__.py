"""The layer below environments and policies: contract types, environment specs, the registry."""
