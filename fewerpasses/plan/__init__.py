"""The run's cost before it runs: each job's predicted seconds from the machine's measured
rates (probe.py), each cell's memory plan (core/memory.py), and the totals (plan.py)."""
