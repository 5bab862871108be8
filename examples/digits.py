"""The digits example, importable from a clone as ``examples.digits`` (run from the repository root).

The code lives in the package (``vcasync.examples.digits``) so an installed vcasync has it too::

    vcasync worker --trainer vcasync.examples.digits:train      # anywhere
    vcasync worker --trainer examples.digits:train              # from a clone's root
"""

from vcasync.examples.digits import evaluate, load_split, model, train

__all__ = ["evaluate", "load_split", "model", "train"]
