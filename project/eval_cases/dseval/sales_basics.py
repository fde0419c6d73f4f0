# A DSEval problem set: sections start with "# %%"; a docstring of YAML (question, validator) opens
# each question, followed by its reference solution. The data is in _inputs/sales_basics/.

# %%
import pandas as pd

# %%
"""
question: |
  Load `inputs/sales.csv` into a variable called `sales`.

validator:
  namespace_check:
    sales:
"""

sales = pd.read_csv("inputs/sales.csv")

# %%
"""
question: How many rows does `sales` have?
"""

len(sales)

# %%
"""
question: What is the total revenue per region?

validator:
  result:
    compare_fn:
      ignore_names: true
"""

sales.groupby("region")["revenue"].sum()
