"""What the tests and the benchmarks share to start servers and talk to them: an in-process server on
ephemeral ports and ``python -m server`` as a process (``servers``), the sentences they send (``sentences``),
certificates for TLS (``certificates``), the replicas, network namespaces and client of the fault runs
(``faults``, ``netns``, ``fault_client``), and the engine tests' loop of a batch with sources arriving
(``arrivals``).

Tests import it and keep their fixtures in ``conftest.py``; benchmarks import it and never ``tests.*``; no test
module imports another. Not installed: pytest and the benchmarks find it from the repository root.
"""
