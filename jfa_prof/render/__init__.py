"""Renderers: rich tables for the terminal, plotly figures for HTML, JSON for scripts.

Each takes analysis results (dataclasses, DataFrames) and a destination, never raw record
buffers, and computes nothing a test would want to check on its own.
"""
