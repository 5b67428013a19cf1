"""Interventions: ablations, patching, sweeps, metrics, tasks, positions, generation with hooks, and their
properties and error messages."""
