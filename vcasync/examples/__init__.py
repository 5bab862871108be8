"""Runnable examples that ship with vcasync (so ``vcasync worker --trainer`` finds them after a pip
install as well as from a clone)."""
