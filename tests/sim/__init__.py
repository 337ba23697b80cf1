"""Deterministic discrete-event simulation of the lane scheduler against a modelled backend."""
