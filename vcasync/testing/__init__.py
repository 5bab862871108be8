"""Public test kit: hypothesis strategies, policy laws, storage conformance.

Merge policies (needs ``hypothesis``, in the ``test`` extra):

- :func:`check_policy` holds any policy to the required laws and the ones it claims;
  :func:`check_law` / ``vcasync.testing.suite.check_<law>`` run one law.
- :mod:`vcasync.testing.strategies`: hypothesis strategies for models, updates and update streams.
- :mod:`vcasync.testing.laws`: each law on one example; :class:`PolicyRun` feeds a policy results
  the way the coordinator does; :class:`LawViolation` is what a broken law raises.
"""

from .harness import LawViolation, PolicyRun
from .suite import check_law, check_policy

__all__ = ["LawViolation", "PolicyRun", "check_law", "check_policy"]
