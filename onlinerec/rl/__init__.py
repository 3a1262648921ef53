"""Reinforcement learning with online recurrent networks: env adapters (``onlinerec.rl.envs``), V-trace, R2AC."""
