"""The orchestrator's Hydra launcher plugin (hydra/launcher=orchestrator)."""
