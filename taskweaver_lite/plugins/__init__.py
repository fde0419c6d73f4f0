"""Plugins in TaskWeaver's format: finding and validating them, and how the models are shown them."""
