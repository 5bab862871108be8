"""Public test kit: hypothesis strategies, policy laws, storage conformance."""
