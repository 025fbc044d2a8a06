"""Helpers under everything: keyed random streams, argument checks, device dispatch, atomic files,
secure randomness, the discrete Gaussian and memory estimates."""
