"""taskweaver_lite: a light code-interpreter agent for data analysis."""

__version__ = "0.1.0"
