"""The `anomaly_detection` plugin: outliers of one numeric column, by z-score or interquartile range."""

from taskweaver.plugin import Plugin, register_plugin

DEFAULT_THRESHOLDS = {"zscore": 3.0, "iqr": 1.5}


@register_plugin
class AnomalyDetection(Plugin):
    """Scores every row, keeps those beyond the threshold, and saves them as a CSV artifact."""

    def __call__(self, df, column: str, method: str = "zscore", threshold: float | None = None):
        import pandas as pd  # imported on first use, so loading the plugin costs the kernel nothing

        if column not in df.columns:
            raise KeyError(f"anomaly_detection: no column {column!r}; the columns are {list(df.columns)}")
        if method not in DEFAULT_THRESHOLDS:
            raise ValueError(f"anomaly_detection: method must be 'zscore' or 'iqr', not {method!r}")
        values = pd.to_numeric(df[column], errors="coerce")
        limit = DEFAULT_THRESHOLDS[method] if threshold is None else float(threshold)
        score = _zscore(values) if method == "zscore" else _iqr_distance(values)
        found = df.assign(anomaly_score=score)[score > limit].sort_values("anomaly_score", ascending=False)
        self.log("info", f"{len(found)} of {len(df)} rows are anomalies in {column!r} ({method} > {limit:g})")
        self.ctx.add_artifact("anomalies", f"anomalies_{column}.csv", "df", found, f"rows of {column!r} flagged by {method}")
        return found


def _zscore(values):
    spread = values.std(ddof=0)
    if not spread:  # a constant column has no outliers; avoid dividing by zero
        return values * 0.0
    return ((values - values.mean()) / spread).abs()


def _iqr_distance(values):
    q1, q3 = values.quantile(0.25), values.quantile(0.75)
    iqr = (q3 - q1) or 1e-12
    below, above = (q1 - values) / iqr, (values - q3) / iqr
    return below.where(below > above, above).clip(lower=0)
