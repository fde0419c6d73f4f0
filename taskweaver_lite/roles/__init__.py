"""The roles: the shared base, the Planner, the CodeGenerator, their prompt templates and few-shot examples."""
