"""Evaluation: TaskWeaver's auto_eval cases and DSEval problem sets run against fresh sessions, scored and costed.

`cases` reads them, `examiner` plays the user, `scoring` marks points (judge model or eval_code in
the kernel), `dseval` checks problem sets, `probe` is what runs inside the kernel, `matrix` names
the settings, `runner` runs case x setting in parallel sessions, `outcome` records each run as it
ends, `report` writes the Markdown, JSON and plot.
"""
