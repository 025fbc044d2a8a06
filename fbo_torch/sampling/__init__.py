"""BoTorch sampling integration."""
