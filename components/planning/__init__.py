"""Planning: what the configuration, the vocabularies and the statistics derive for the embedding
tables, between the contracts the stages hand each other and the stages themselves: the plan's
derivation (derivation.py), the row and memory rules (sizing.py), the plan fitted to a slice and
checked against its memory (fitting.py), the capacity a configuration needs before any data is read
(capacity.py), and a training run's plan and length (run_plan.py)."""
