"""Upper bounds on the built-in policies' integer parameters, checked in their constructors.

An integer parameter is a count (results in a buffer, accepted results, versions), and a value far
beyond any run is a typo (``10**18`` for ``10**3``), not a setting: a ``buffer_size`` no run fills
keeps the model at version 0 until the run's end, ``median``'s buffer holds a copy of the model per
result and would fill the coordinator's memory before it ever aggregated, and a gate ``warmup`` no
run reaches switches its statistical checks off. So each is refused by its constructor, before
``init_state`` allocates anything, with a :class:`~vcasync.errors.ConfigError` naming the policy and
the parameter (``vcasync coordinator`` exits 2). The bounds are in docs/policies.md.
"""

from __future__ import annotations

from typing import Final

from vcasync.errors import ConfigError

__all__ = ["MAX_BUFFER", "MAX_COPIES", "MAX_GATE_WINDOW", "MAX_VERSIONS", "MAX_WARMUP", "at_most",
           "shown"]

#: ``buffer_size`` of a policy whose buffer is one running sum (``fedbuff``, ``diloco``, ``sync``).
MAX_BUFFER: Final = 1_000_000
#: ``buffer_size`` of a policy that keeps a full copy of the model per buffered result
#: (``median``, ``trimmed_mean``): K copies of the model in the coordinator's memory.
MAX_COPIES: Final = 1_000
#: ``gate``'s ``warmup`` (accepted results before its statistical checks).
MAX_WARMUP: Final = 1_000_000
#: ``gate``'s ``window`` (base versions whose statistics its state keeps, six numbers each).
MAX_GATE_WINDOW: Final = 100_000
#: A count of versions (``vcasgd``'s ``horizon``, the staleness cut-off ``b``): 2**40, the bound
#: the policy laws draw versions and staleness up to.
MAX_VERSIONS: Final = 2**40


def at_most(policy: str, name: str, value: int, bound: int, why: str) -> None:
    """Refuse ``value`` of parameter ``name`` above ``bound`` (``why``: what the bound protects)."""
    if value > bound:
        raise ConfigError(f"{policy}: {name} must be at most {bound:,}, got {shown(value)} ({why})")


def shown(value: int) -> str:
    """``value`` for a message: its digits, or its size where they would not fit a line (Python
    refuses to print an integer of more than 4,300 digits at all)."""
    return f"{value:,}" if value.bit_length() <= 256 else f"an integer of {value.bit_length():,} bits"
