"""Batched local training of a rank's clients, client-state stores, evaluation."""
