"""Cloud adapters: the only modules that import the cloud SDKs."""
