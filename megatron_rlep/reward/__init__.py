"""Scoring answers: the math rule, math equivalence, the code sandbox, plug-ins, and the scorer that runs them once for all ranks."""
