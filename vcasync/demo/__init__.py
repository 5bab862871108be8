"""``vcasync demo``: a coordinator and real worker processes training a small CNN on a simulated spot market.

Kept light on import: the CLI loads the heavy parts (torch models, scikit-learn data, rich) only when
the subcommand runs.
"""
