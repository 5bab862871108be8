"""Cost to target: instance prices, spot prices that move, the target and the billing arithmetic, spread.

Shared by the simulator (:mod:`vcasync.sim`) and the demo (:mod:`vcasync.demo`), which never import
each other: :mod:`.prices` (the price table with sources), :mod:`.market` (spot price traces and random
walks), :mod:`.target` (target, billed sessions, cost to target, saving), :mod:`.spread` (mean and a 95 %
interval over seeds, misses counted), :mod:`.params` (``key=value`` command-line parameters).
Pure numbers in, numbers out: nothing here imports torch or the coordinator.
"""
