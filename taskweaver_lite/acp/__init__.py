"""This agent for editors over the Agent Client Protocol (`taskweaver-lite acp`): Zed, JetBrains, Neovim, JupyterLab's chat."""
