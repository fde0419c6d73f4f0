"""Prompt templates (Jinja2 in YAML), installed as the data package `taskweaver_lite.prompts`.

`taskweaver_lite.llm.templates` reads them with importlib.resources; an editable install maps this
folder in place, so a checkout and an installed package read the same way.
"""
