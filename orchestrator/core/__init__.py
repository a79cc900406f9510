"""Plumbing every layer uses and that imports nothing of the orchestrator: errors and their exit
codes, secrets masked, atomic writes and bounded reads, processes, timing statistics.
"""
