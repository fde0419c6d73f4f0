"""Compatibility with other agents' formats, fenced so the rest of the package never names them."""
