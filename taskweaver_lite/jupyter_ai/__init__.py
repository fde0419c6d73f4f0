"""This agent in JupyterLab's chat: a Jupyter AI persona (the `jupyter` extra)."""
