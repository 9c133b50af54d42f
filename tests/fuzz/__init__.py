"""Hostile input for every endpoint."""
