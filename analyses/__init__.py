"""Analyses: pure functions over traces, compile results and reports (import as jfa_prof.analyses)."""
