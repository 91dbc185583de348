"""The bench: runs a tuning policy against a simulated scenario and scores it (DESIGN.md §5).

``spectune bench`` (``bench/command.py``) and ``benchmarks/bench_all.py`` call
:func:`~spectune.bench.runner.run_bench`. The pieces: ``adapters`` (the simulator body's
ports: actuator, metrics from exposition text, virtual clock), ``oracle`` (every static arm
simulated on the same seed and traffic, cached on disk), ``scoring`` (phases, objective
values from request records, efficiency, guardrail breaches), ``registry`` (policies by
name) and ``runner`` (puts them together and builds the JSON contract).

Importing this package is cheap: the heavy modules are imported by whoever uses them.
"""
