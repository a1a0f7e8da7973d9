"""Mapping rules: foreign provers' span names, events and log lines onto the proof contract.

A rule file (TOML) says which of a prover's own spans, span events or output lines are
which proof phase. ``presets/`` holds the rule files shipped for real provers.
"""
