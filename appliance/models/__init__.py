"""The local model store: manifests with sha256, bundled-model provisioning, loading."""
