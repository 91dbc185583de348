"""spectune: tunes speculative decoding for LLM serving deployments under live traffic.

The package is laid out in the layers of DESIGN.md §2: ``core`` (pure math), ``engines``
(per-engine metric catalogues and argument handling), ``metrics`` (metric sources),
``diagnose`` (findings), and the bodies that drive them (the CLI, later the operator and
the simulator). Importing it has no side effects.
"""

__version__ = "0.1.0"
