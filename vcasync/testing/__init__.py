"""Public test kit: hypothesis strategies, policy laws, storage conformance.

Merge policies (needs ``hypothesis``, in the ``test`` extra):

- :func:`check_policy` holds any policy to the required laws and the ones it claims;
  :func:`check_law` / ``vcasync.testing.suite.check_<law>`` run one law.
- :mod:`vcasync.testing.strategies`: hypothesis strategies for models, updates and update streams.
- :mod:`vcasync.testing.laws`: each law on one example; :class:`PolicyRun`
  (:mod:`vcasync.testing.policy_run`) feeds a policy results the way the coordinator does;
  :class:`LawViolation` is what a broken law raises.

Storage backends (needs ``pytest`` and ``pytest-asyncio``; import the modules directly):

- :class:`vcasync.testing.storage.StorageConformance`: the laws every backend keeps, to mix in.
- :mod:`vcasync.testing.faults`: :class:`FaultyStorage` fails, delays or breaks a seeded share of calls.
- :mod:`vcasync.testing.emulators`: moto's S3 server and gcp-storage-emulator on 127.0.0.1.

The kit imports only vcasync's public API. The repository's chaos, hostile-input, fuzz and fleet
harness is not part of it (nor of the installed package): it lives in the source tree's
``harness/``, for vcasync's own tests and benchmarks.
"""

import sys

if "pytest" in sys.modules:
    # Under pytest, have it rewrite the asserts of the suite's mixin as it does a test module's,
    # so that a backend failing one is told what differed (`['b', 'a'] == ['a', 'b']`), not a
    # bare AssertionError: pytest rewrites only test modules and conftests unless asked.
    sys.modules["pytest"].register_assert_rewrite("vcasync.testing.storage")

from .policy_run import LawViolation, PolicyRun
from .suite import check_law, check_policy

__all__ = ["LawViolation", "PolicyRun", "check_law", "check_policy"]
