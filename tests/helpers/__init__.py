"""Shared test helpers (Arrow data, Flight servers and clients); imported as `helpers.*`."""
