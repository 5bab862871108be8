"""Storage backends, installed as ``vcasync.backends``; chosen by URL scheme."""
