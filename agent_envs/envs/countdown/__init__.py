"""Countdown: reach a target number from 3-4 given numbers with + - * /, each used exactly once.

Pure parts only (task model, generator, loader, solver, scorer); the environment is wired in
through the environment registry.
"""
