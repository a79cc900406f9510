"""Everything that times or probes this machine: its facts, a trial's kernels, the engine's step,
the links, nccl-tests logs, the host's load and memory; what the plan takes (plan/inputs.py)
comes from here.
"""
